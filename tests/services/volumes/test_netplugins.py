"""The nfs, iscsi and fc plugins' commands and device lookups are the kubelet's (fake runner,
fake /dev): argv of every call, the device paths searched, the error messages."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from podvisor.services.pod import FCVolume, ISCSIVolume, NFSVolume
from podvisor.services.volumes import netplugins
from podvisor.services.volumes.hostexec import FakeRunner, Ran, RunnerError

IQN = "iqn.2001-04.com.example:storage.disk1"
DEVICE = f"/dev/disk/by-path/ip-10.0.0.1:3260-iscsi-{IQN}-lun-0"
IFACE = "# BEGIN RECORD\niface.iscsi_ifacename = default\niface.transport_name = tcp\n"


def test_nfs_mounts_server_path_read_only_with_the_pv_mount_options() -> None:
    runner = FakeRunner()
    netplugins.nfs_setup(runner, NFSVolume("nfs.example", "/exports/a"), "/pods/u/v", True,
                         ["nfsvers=4.1", "hard"])
    assert runner.calls == [["mount", "-t", "nfs", "-o", "ro,nfsvers=4.1,hard",
                             "nfs.example:/exports/a", "/pods/u/v"]]
    runner = FakeRunner()
    netplugins.nfs_setup(runner, NFSVolume("s", "/e"), "/t", False, [])
    assert runner.calls == [["mount", "-t", "nfs", "s:/e", "/t"]]


def test_a_failed_mount_says_what_mount_said() -> None:
    runner = FakeRunner(lambda argv: Ran("mount: /t: bad option.\n", "exit status 32"))
    with pytest.raises(RunnerError) as err:
        netplugins.nfs_setup(runner, NFSVolume("s", "/e"), "/t", False, [])
    assert str(err.value) == ("mount failed: exit status 32\nMounting command: mount\n"
                              "Mounting arguments: -t nfs s:/e /t\nOutput: mount: /t: bad "
                              "option.\n")


class Iscsi:
    """iscsiadm as on a node with an initiator: the device appears after the login."""

    def __init__(self, devices: netplugins.FakeDevices, login_fails: bool = False) -> None:
        self.devices = devices
        self.login_fails = login_fails

    def __call__(self, argv: Sequence[str]) -> Ran:
        if argv[:5] == ["iscsiadm", "-m", "iface", "-I", "default"]:
            return Ran(IFACE)
        if "--login" in argv:
            if self.login_fails:
                return Ran("iscsiadm: initiator reported error (24)", "exit status 24")
            self.devices.links[DEVICE] = "/dev/sdb"
        return Ran()


def test_iscsi_discovers_logs_in_and_finds_the_by_path_device() -> None:
    devices = netplugins.FakeDevices()
    runner = FakeRunner(Iscsi(devices))
    source = ISCSIVolume("10.0.0.1", IQN, 0, fs_type="ext4")
    device, disk = netplugins.iscsi_setup(runner, devices, source, "disk", {})
    assert device == "/dev/sdb"
    assert disk == netplugins.IscsiDisk(("10.0.0.1:3260",), IQN, 0, "default")
    assert runner.calls == [
        ["iscsiadm", "-m", "iface", "-I", "default", "-o", "show"],
        ["iscsiadm", "-m", "discoverydb", "-t", "sendtargets", "-p", "10.0.0.1:3260", "-I",
         "default", "-o", "new"],
        ["iscsiadm", "-m", "discoverydb", "-t", "sendtargets", "-p", "10.0.0.1:3260", "-I",
         "default", "--discover"],
        ["iscsiadm", "-m", "node", "-p", "10.0.0.1:3260", "-T", IQN, "-I", "default",
         "--login"]]
    # logged in already: the device is there, no iscsiadm call but the iface's
    runner.calls.clear()
    netplugins.iscsi_setup(runner, devices, source, "disk", {})
    assert runner.calls == [["iscsiadm", "-m", "iface", "-I", "default", "-o", "show"]]
    runner.calls.clear()
    netplugins.iscsi_logout(runner, disk)
    assert runner.calls == [
        ["iscsiadm", "-m", "node", "-p", "10.0.0.1:3260", "-T", IQN, "--logout", "-I",
         "default"],
        ["iscsiadm", "-m", "node", "-p", "10.0.0.1:3260", "-T", IQN, "-o", "delete", "-I",
         "default"]]


def test_iscsi_chap_keys_come_from_the_secret() -> None:
    devices = netplugins.FakeDevices()
    runner = FakeRunner(Iscsi(devices))
    source = ISCSIVolume("10.0.0.1:3260", IQN, 0, chap_auth_session=True, secret_ref="chap")
    netplugins.iscsi_setup(runner, devices, source, "disk", {
        "node.session.auth.username": "u", "node.session.auth.password": "p"})
    node = ["iscsiadm", "-m", "node", "-p", "10.0.0.1:3260", "-T", IQN, "-I", "default"]
    assert [*node, "-o", "update", "-n", "node.session.auth.authmethod", "-v", "CHAP"] \
        in runner.calls
    assert [*node, "-o", "update", "-n", "node.session.auth.username", "-v", "u"] \
        in runner.calls
    assert [*node, "-o", "update", "-n", "node.session.auth.password", "-v", "p"] \
        in runner.calls
    assert runner.calls.index([*node, "-o", "update", "-n", "node.session.auth.password",
                               "-v", "p"]) < runner.calls.index([*node, "--login"])


def test_iscsi_failures_say_what_the_kubelet_says() -> None:
    devices = netplugins.FakeDevices()
    runner = FakeRunner(Iscsi(devices, login_fails=True))
    with pytest.raises(RunnerError) as err:
        netplugins.iscsi_setup(runner, devices, ISCSIVolume("10.0.0.1", IQN, 0), "d", {})
    assert str(err.value) == (
        "failed to get any path for iscsi disk, last err seen:\niscsi: failed to attach disk: "
        "Error: iscsiadm: initiator reported error (24) (exit status 24)")
    assert ["iscsiadm", "-m", "node", "-p", "10.0.0.1:3260", "-T", IQN, "-I", "default",
            "-o", "delete"] in runner.calls
    missing = FakeRunner(lambda argv: Ran("", 'exec: "iscsiadm": executable file not found '
                                              "in $PATH"))
    with pytest.raises(RunnerError, match=r"could not read iface default error: exec: "):
        netplugins.iscsi_setup(missing, devices, ISCSIVolume("10.0.0.1", IQN, 0), "d", {})


def test_fc_finds_the_disk_by_wwn_and_lun_or_by_wwid_then_its_multipath_device() -> None:
    devices = netplugins.FakeDevices({
        "/dev/disk/by-path/pci-0000:41:00.0-fc-0x500a0982991b8dc5-lun-2": "/dev/sdc",
        "/dev/disk/by-id/scsi-3600508b400105e210000900000490000": "/dev/sdd",
        "/sys/block/dm-1/slaves/sdd": "/sys/block/dm-1/slaves/sdd"})
    assert netplugins.fc_setup(devices, FCVolume(("500a0982991b8dc5",), 2)) == "/dev/sdc"
    assert netplugins.fc_setup(devices, FCVolume(
        wwids=("3600508b400105e210000900000490000",))) == "/dev/dm-1"
    assert devices.rescans == 0
    with pytest.raises(RunnerError, match=r"^no fc disk found$"):
        netplugins.fc_setup(devices, FCVolume(("500a0982991b8dc5",), 3))
    assert devices.rescans == 1  # searched again after a rescan of the SCSI hosts


def test_a_blank_disk_is_formatted_before_its_mount_a_read_only_one_never() -> None:
    runner = FakeRunner(lambda argv: Ran("", "exit status 2") if argv[0] == "blkid" else Ran())
    netplugins.format_and_mount(runner, "/dev/sdb", "/t", "ext4", False)
    assert runner.calls == [
        ["blkid", "-p", "-s", "TYPE", "-s", "PTTYPE", "-o", "export", "/dev/sdb"],
        ["mkfs.ext4", "-F", "-m0", "/dev/sdb"],
        ["mount", "-t", "ext4", "-o", "rw", "/dev/sdb", "/t"]]
    runner.calls.clear()
    netplugins.format_and_mount(runner, "/dev/sdb", "/t", "xfs", True)
    assert runner.calls == [["mount", "-t", "xfs", "-o", "ro", "/dev/sdb", "/t"]]


def test_portals_default_to_port_3260() -> None:
    assert netplugins.portal("10.0.0.1") == "10.0.0.1:3260"
    assert netplugins.portal("10.0.0.1:3261") == "10.0.0.1:3261"


def test_the_host_runner_reports_as_go_does(tmp_path: Path) -> None:
    from podvisor.services.volumes.hostexec import HostRunner
    run = HostRunner().run
    assert run(["sh", "-c", "echo out; echo err >&2"]) == Ran("out\nerr\n")
    assert run(["sh", "-c", "exit 3"]).error == "exit status 3"
    assert run([str(tmp_path / "none")]).error == (
        f'exec: "{tmp_path / "none"}": executable file not found in $PATH')
