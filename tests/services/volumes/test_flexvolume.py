"""FlexVolume: driver discovery (probe, ``init`` once, capabilities), the call protocol, the
mount and unmount of a pod's volume (fake runner and mounter), reconstruction of its folders;
tests/services/volumes/test_e2e_flexvolume.py runs a real driver."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from podvisor.services.pod import FlexVolume, NFSVolume
from podvisor.services.volumes.flexvolume import Capabilities, FlexDrivers, FlexError
from podvisor.services.volumes.hostexec import FakeRunner, Ran
from podvisor.services.volumes.mounter import FakeMounter
from podvisor.services.volumes.netplugins import FakeDevices
from podvisor.services.volumes.pluginops import PluginFailed, PluginMounts
from podvisor.services.volumes.reconstruct import reconstruct
from podvisor.services.volumes.resolve import plugin_spec
from podvisor.services.volumes.spec import Plugin, VolumePaths, VolumeSpec
from podvisor.services.volumes.state import Mounted, MountKey

INIT = json.dumps({"status": "Success", "capabilities": {"attach": False}})


class Driver:
    """A driver's answers by command; ``calls`` what it was asked."""

    def __init__(self, **answers: str) -> None:
        self.answers = {"init": INIT, **answers}

    def __call__(self, argv: Sequence[str]) -> Ran:
        out = self.answers.get(argv[1], json.dumps({"status": "Not supported"}))
        status = json.loads(out).get("status") if out.startswith("{") else ""
        return Ran(out, "" if status == "Success" else "exit status 1")


def _plugin_dir(tmp_path: Path, *names: str) -> Path:
    root = tmp_path / "exec"
    for name in names:
        folder = root / name.replace("/", "~")
        folder.mkdir(parents=True)
        exe = folder / name.rsplit("/", 1)[-1]
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    return root


def test_drivers_are_probed_and_init_once_until_they_change(tmp_path: Path) -> None:
    root = _plugin_dir(tmp_path, "example.com/lvm")
    (root / ".hidden").mkdir()
    runner = FakeRunner(Driver())
    drivers = FlexDrivers(root, runner)
    assert drivers.probe() is True
    assert drivers.probe() is False
    exe = str(root / "example.com~lvm" / "lvm")
    assert runner.calls == [[exe, "init"]]
    assert drivers.get("example.com/lvm").capabilities == Capabilities(attach=False)
    assert drivers.folders() == {"example.com~lvm": "example.com/lvm"}
    os.utime(exe, (1, 1))  # the executable replaced: init again
    assert drivers.probe() is True and runner.calls[-1] == [exe, "init"]
    (root / "example.com~lvm" / "lvm").unlink()
    (root / "example.com~lvm").rmdir()
    assert drivers.probe() is True and drivers.folders() == {}


def test_a_driver_whose_init_fails_is_skipped(tmp_path: Path) -> None:
    root = _plugin_dir(tmp_path, "x/bad")
    logged: list[dict[str, object]] = []
    drivers = FlexDrivers(root, FakeRunner(Driver(init='{"status": "Failure", "message": '
                                                      '"no lvm"}')),
                          lambda event, **f: logged.append({"event": event, **f}))
    drivers.probe()
    assert drivers.folders() == {}
    assert logged[-1]["message"] == ("error creating Flexvolume plugin from directory x~bad, "
                                     "skipping. Error: init command failed, status: Failure, "
                                     "reason: no lvm")


def test_capabilities_default_as_the_kubelets() -> None:
    assert Capabilities.of(None) == Capabilities(attach=True, fs_group=True)
    assert Capabilities.of({"attach": False, "fsGroup": False}).fs_group is False


def _spec(**extra: object) -> VolumeSpec:
    base = {"pod_uid": "u1", "pod_name": "web", "pod_namespace": "ns", "volume": "data",
            "fs_group": None, "on_root_mismatch": False, "service_account": "robot"}
    base.update(extra)
    return plugin_spec(FlexVolume("example.com/lvm", "xfs", "creds", False, {"size": "1G"}),
                       base, "data", False, "ns")


def _mounts(tmp_path: Path, driver: Driver) -> tuple[PluginMounts, FakeRunner, FakeMounter]:
    runner, mounter = FakeRunner(driver), FakeMounter()
    drivers = FlexDrivers(_plugin_dir(tmp_path, "example.com/lvm"), runner)
    drivers.probe()
    runner.calls.clear()
    return (PluginMounts(VolumePaths(tmp_path / "root"), mounter, runner, drivers,
                         FakeDevices()), runner, mounter)


def test_mount_calls_the_driver_with_the_kubelets_options(tmp_path: Path) -> None:
    mounts, runner, _ = _mounts(tmp_path, Driver(mount='{"status": "Success"}'))
    spec = _spec(fs_group=2000)
    folder = tmp_path / "root" / "pods" / "u1" / "volumes" / "example.com~lvm" / "data"
    assert VolumePaths(tmp_path / "root").target(spec) == folder
    assert spec.unique_name == "flexvolume-example.com/lvm/u1-data"
    mounts.setup(spec, folder, {"password": b"s3cret"})
    ((_exe, command, target, options),) = runner.calls
    assert (command, target) == ("mount", str(folder))
    assert json.loads(options) == {
        "kubernetes.io/fsType": "xfs", "kubernetes.io/readwrite": "rw",
        "kubernetes.io/pvOrVolumeName": "data", "kubernetes.io/pod.name": "web",
        "kubernetes.io/pod.namespace": "ns", "kubernetes.io/pod.uid": "u1",
        "kubernetes.io/serviceAccount.name": "robot",
        "kubernetes.io/mounterArgs.FsGroup": "2000",
        "kubernetes.io/secret/password": base64.b64encode(b"s3cret").decode(), "size": "1G"}
    st = folder.stat()  # fsGroup applied: the group's, rwx and setgid
    assert st.st_gid == 2000 and st.st_mode & 0o2070 == 0o2070


def test_a_failed_mount_names_the_driver_answer_and_removes_the_folder(tmp_path: Path) -> None:
    mounts, _, _ = _mounts(tmp_path, Driver(mount='{"status": "Failure", "message": "offline"}'))
    folder = tmp_path / "f"
    with pytest.raises(PluginFailed) as err:
        mounts.setup(_spec(), folder, {})
    assert (err.value.op, err.value.message) == (
        "MountVolume.SetUp", "mount command failed, status: Failure, reason: offline")
    assert not folder.exists()


def test_an_unknown_or_attaching_driver_fails_the_mount(tmp_path: Path) -> None:
    mounts, _, _ = _mounts(tmp_path, Driver())
    spec = plugin_spec(FlexVolume("other/x"), {"pod_uid": "u", "pod_name": "p",
                                               "pod_namespace": "n", "volume": "v"},
                       "v", False, "n")
    with pytest.raises(PluginFailed, match="no volume plugin matched"):
        mounts.setup(spec, tmp_path / "v", {})
    attaching, _, _ = _mounts(tmp_path / "b", Driver(init='{"status": "Success"}'))
    with pytest.raises(PluginFailed, match="attaches"):
        attaching.setup(_spec(), tmp_path / "w", {})


def test_unmount_calls_the_driver_not_supported_falls_back_to_umount(tmp_path: Path) -> None:
    mounts, runner, mounter = _mounts(tmp_path, Driver(mount='{"status": "Success"}'))
    folder = tmp_path / "root" / "pods" / "u1" / "volumes" / "example.com~lvm" / "data"
    folder.mkdir(parents=True)
    mounter.bind("/srv", str(folder), False)
    key = MountKey("u1", Plugin.FLEX, "data", "example.com/lvm")
    mounts.teardown(key, folder)  # unmount: "Not supported" (the Driver's default)
    assert runner.calls[-1][1:] == ["unmount", str(folder)]
    assert ("unmount", str(folder)) in mounter.calls and not folder.exists()
    runner.calls.clear()
    mounts.teardown(key, folder)  # gone: nothing to do
    assert runner.calls == []
    driver = mounts.flex.get("example.com/lvm")
    assert "unmount" in driver.unsupported  # not asked again
    with pytest.raises(FlexError, match="Not supported"):
        mounts.flex.call(driver, "unmount", "/x")


def test_reconstruction_finds_plugin_and_flex_folders(tmp_path: Path) -> None:
    paths = VolumePaths(tmp_path)
    for folder in ("kubernetes.io~nfs/n", "example.com~lvm/data", "other~gone/x",
                   "kubernetes.io~empty-dir/e"):
        (paths.pods / "u1" / "volumes" / folder).mkdir(parents=True)
    actual = reconstruct(paths, flex={"example.com~lvm": "example.com/lvm"})
    assert {k: r.state for k, r in actual.mounts.items()} == {
        MountKey("u1", Plugin.NFS, "n"): Mounted.UNCERTAIN,
        MountKey("u1", Plugin.FLEX, "data", "example.com/lvm"): Mounted.UNCERTAIN}


def test_a_pv_of_nfs_mounts_with_its_mount_options(tmp_path: Path) -> None:
    spec = plugin_spec(NFSVolume("s", "/e"), {"pod_uid": "u", "pod_name": "p",
                                              "pod_namespace": "n", "volume": "v"},
                       "pv1", True, "n", "claim", ("hard",))
    runner = FakeRunner()
    mounts = PluginMounts(VolumePaths(tmp_path), FakeMounter(), runner,
                          FlexDrivers(tmp_path / "none", runner), FakeDevices())
    folder = VolumePaths(tmp_path).target(spec)
    assert folder == tmp_path / "pods" / "u" / "volumes" / "kubernetes.io~nfs" / "pv1"
    mounts.setup(spec, folder, {})
    assert runner.calls == [["mount", "-t", "nfs", "-o", "ro,hard", "s:/e", str(folder)]]


class NoSecrets:
    def get(self, path: str) -> None:
        return None


def test_operations_mount_and_unmount_a_flexvolume_and_say_why_not(tmp_path: Path) -> None:
    """Through the reconciler's operations: a missing Secret is the kubelet's FailedMount
    (no record left), a mount is recorded, the unmount forgets it and prunes the folders."""
    from podvisor.services.volumes.operations import Operations, OpFailed
    from podvisor.services.volumes.state import ActualState, Op, Step, device_of
    mounts, runner, mounter = _mounts(tmp_path, Driver(mount='{"status": "Success"}'))
    ops = Operations(mounts.paths, mounter, None, NoSecrets(), "n1",  # type: ignore[arg-type]
                     plugins=mounts)
    spec, actual = _spec(), ActualState()
    step = Step(Op.MOUNT, device_of(spec), MountKey.of(spec), spec)
    with pytest.raises(OpFailed) as err:
        ops.run(step, actual)
    assert (err.value.reason, err.value.message) == (
        "FailedMount", 'MountVolume.SetUp failed for volume "data" : couldn\'t get secret '
                       'ns/creds err: secrets "creds" not found')
    assert actual.mounts == {} and runner.calls == []
    no_secret = plugin_spec(FlexVolume("example.com/lvm"), {
        "pod_uid": "u1", "pod_name": "web", "pod_namespace": "ns", "volume": "data"},
        "data", False, "ns")
    key = MountKey.of(no_secret)
    ops.run(Step(Op.MOUNT, device_of(no_secret), key, no_secret), actual)
    assert actual.mounts[key].state is Mounted.YES
    folder = mounts.paths.target(no_secret)
    ops.run(Step(Op.UNMOUNT, device_of(no_secret), key), actual)
    assert [c[1:3] for c in runner.calls] == [["mount", str(folder)], ["unmount", str(folder)]]
    assert actual.mounts == {} and not (mounts.paths.pods / "u1").exists()


def test_mount_not_supported_binds_the_device_mount_path_as_the_kubelets_default(
        tmp_path: Path) -> None:
    mounts, _, mounter = _mounts(tmp_path, Driver())  # mount: "Not supported"
    folder = tmp_path / "f"
    device = tmp_path / "root" / "plugins" / "kubernetes.io" / "flexvolume" / "example.com" / \
        "lvm" / "mounts" / "data"
    mounter.fail[str(folder)] = OSError(2, f"mount {device} on {folder}: No such file or "
                                           "directory")
    with pytest.raises(PluginFailed, match="No such file or directory"):
        mounts.setup(_spec(), folder, {})
    assert mounter.calls == [("bind", str(folder))] and not folder.exists()
    mounts.setup(_spec(), folder, {})  # "Not supported" remembered: bound at once
    assert mounter.table[0].source == str(device)
