"""The operations on local PVs with the fake mounter, and the reconstruction of what a restart
finds on disk: a local volume bound once (a second pass finds the mount and binds nothing),
fsGroup applied, the unmount removing the folders; CSI folders with their ``vol_data.json``
found again as uncertain records, a folder without one left alone."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from podvisor.services.volumes.mounter import FakeMounter
from podvisor.services.volumes.operations import Operations, OpFailed
from podvisor.services.volumes.reconstruct import reconstruct
from podvisor.services.volumes.spec import Plugin, VolumePaths, VolumeSpec
from podvisor.services.volumes.state import (
    ActualState,
    Mounted,
    MountKey,
    Op,
    Step,
    device_of,
)


class NoDrivers:
    def client(self, driver: str) -> object:
        raise LookupError(driver)


def local_spec(path: Path, fs_group: int | None = None) -> VolumeSpec:
    return VolumeSpec("uid1", "p", "default", "data", "pv1", Plugin.LOCAL,
                      "kubernetes.io/local-volume/pv1", path=str(path), fs_group=fs_group)


def test_a_local_volume_is_bound_once_and_unbound(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    paths, mounter = VolumePaths(tmp_path / "root"), FakeMounter()
    ops = Operations(paths, mounter, NoDrivers(), None, "n1")  # type: ignore[arg-type]
    spec = local_spec(disk, fs_group=os.getgid())
    actual = ActualState()
    step = Step(Op.MOUNT, device_of(spec), MountKey.of(spec), spec)
    ops.run(step, actual)
    ops.run(step, actual)  # again (a reconstructed, uncertain mount): nothing bound twice
    folder = paths.pod_volume("uid1", Plugin.LOCAL, "pv1")
    assert [c for c in mounter.calls if c[0] == "bind"] == [("bind", str(folder))]
    assert actual.mounts[MountKey.of(spec)].state is Mounted.YES
    assert os.stat(folder).st_mode & 0o2070 == 0o2070  # fsGroup: g+rwx, setgid
    ops.run(Step(Op.UNMOUNT, device_of(spec), MountKey.of(spec)), actual)
    assert not mounter.mounts() and not actual.mounts
    assert not (paths.pods / "uid1").exists()


def test_reconstruction_finds_what_was_left(tmp_path: Path) -> None:
    paths = VolumePaths(tmp_path / "root")
    csi = paths.pod_volume("uid1", Plugin.CSI, "pv-csi")
    csi.mkdir(parents=True)
    (csi / "vol_data.json").write_text(json.dumps({"driverName": "d", "volumeHandle": "h",
                                                   "volumeLifecycleMode": "Persistent"}))
    paths.pod_volume("uid1", Plugin.CSI, "broken").mkdir(parents=True)
    paths.pod_volume("uid2", Plugin.LOCAL, "pv-local").mkdir(parents=True)
    staging = paths.staging("d", "h")
    staging.mkdir(parents=True)
    (staging.parent / "vol_data.json").write_text(json.dumps({
        "driverName": "d", "volumeHandle": "h", "attachmentID": "csi-1"}))
    skipped: list[str] = []
    actual = reconstruct(paths, lambda event, **f: skipped.append(f.get("path", ""))
                         if event == "volumes.reconstruct.skipped" else None)
    assert {(k.pod_uid, str(k.plugin), k.spec_name): r.state
            for k, r in actual.mounts.items()} == {
        ("uid1", "kubernetes.io/csi", "pv-csi"): Mounted.UNCERTAIN,
        ("uid2", "kubernetes.io/local-volume", "pv-local"): Mounted.UNCERTAIN}
    [device] = actual.devices.values()
    assert device.staged is Mounted.UNCERTAIN and device.device.attach_id == "csi-1"
    assert device.device.unique_name == "kubernetes.io/csi/d^h" and not device.attached
    assert skipped == [str(paths.pod_volume("uid1", Plugin.CSI, "broken"))]


def test_a_local_block_volume_is_mapped_once_and_unmapped(tmp_path: Path) -> None:
    """volumepathhandler's layout: the device bound on the global map path's ``<pod uid>``
    file, a symlink to it at the pod device map path; a second pass binds nothing; the
    reconstruction finds the symlink (or a bind left without one); unmap removes both."""
    device = "/dev/null"  # a character device: refused (a block device is needed)
    paths, mounter = VolumePaths(tmp_path / "root"), FakeMounter()
    ops = Operations(paths, mounter, NoDrivers(), None, "n1")  # type: ignore[arg-type]
    actual = ActualState()
    bad = VolumeSpec("uid1", "p", "default", "data", "pv1", Plugin.LOCAL,
                     "kubernetes.io/local-volume/pv1", path=device, block=True)
    with pytest.raises(OpFailed, match='"/dev/null" is not a block device') as err:
        ops.run(Step(Op.MOUNT, device_of(bad), MountKey.of(bad), bad), actual)
    assert err.value.reason == "FailedMapVolume"
    block = next((f"/dev/{n}" for n in sorted(os.listdir("/dev"))
                  if os.path.exists(f"/dev/{n}") and stat.S_ISBLK(os.stat(f"/dev/{n}").st_mode)),
                 None)
    if block is None:
        pytest.skip("no block device in /dev to map")
    spec = VolumeSpec("uid1", "p", "default", "data", "pv1", Plugin.LOCAL,
                      "kubernetes.io/local-volume/pv1", path=block, block=True)
    key = MountKey.of(spec)
    step = Step(Op.MOUNT, device_of(spec), key, spec)
    ops.run(step, actual)
    ops.run(step, actual)
    bind = paths.global_map(Plugin.LOCAL, "pv1") / "uid1"
    assert bind == tmp_path / "root/plugins/kubernetes.io/local-volume/volumeDevices/pv1/uid1"
    link = paths.pod_device_map("uid1", Plugin.LOCAL, "pv1")
    assert link == tmp_path / "root/pods/uid1/volumeDevices/kubernetes.io~local-volume/pv1"
    assert [c for c in mounter.calls if c[0] == "bind"] == [("bind", str(bind))]
    assert os.readlink(link) == block and paths.target(spec) == link
    assert actual.mounts[key].state is Mounted.YES
    found = reconstruct(paths)
    assert found.mounts[key].state is Mounted.UNCERTAIN and key.block
    link.unlink()  # a crash between the bind and the symlink: the bind is found too
    assert key in reconstruct(paths).mounts
    ops.run(Step(Op.UNMOUNT, device_of(spec), key), actual)
    assert not mounter.mounts() and not actual.mounts
    assert not bind.exists() and not bind.parent.exists() and not link.exists()
    assert not (paths.pods / "uid1").exists()


def test_reconstruction_finds_csi_raw_block_volumes(tmp_path: Path) -> None:
    """A CSI raw block device from its ``volumeDevices/<pv>/data/vol_data.json`` (staged when
    its staging folder is there), and each pod using it from its symlink, its global map bind
    file or its publish path alone (whichever a crash left)."""
    paths = VolumePaths(tmp_path / "root")
    data = paths.csi_block_data("pv1")
    data.mkdir(parents=True)
    (data / "vol_data.json").write_text(json.dumps({
        "driverName": "d", "volumeHandle": "h", "attachmentID": "", "specVolID": "pv1",
        "volumeMode": "Block"}))
    paths.csi_block_staging("pv1").mkdir(parents=True)
    link = paths.pod_device_map("uid1", Plugin.CSI, "pv1")
    link.parent.mkdir(parents=True)
    os.symlink(paths.csi_block_publish("pv1", "uid1"), link)
    paths.global_map(Plugin.CSI, "pv1").mkdir(parents=True)
    (paths.global_map(Plugin.CSI, "pv1") / "uid2").touch()
    paths.csi_block_publish("pv1", "uid3").parent.mkdir(parents=True)
    paths.csi_block_publish("pv1", "uid3").touch()
    actual = reconstruct(paths)
    [device] = actual.devices.values()
    assert device.device.block_name == "pv1" and device.staged is Mounted.UNCERTAIN
    assert device.device.unique_name == "kubernetes.io/csi/d^h"
    assert sorted((k.pod_uid, k.block, r.device.handle) for k, r in actual.mounts.items()) == [
        ("uid1", True, "h"), ("uid2", True, "h"), ("uid3", True, "h")]
    assert paths.global_map(Plugin.CSI, "pv1") == \
        tmp_path / "root/plugins/kubernetes.io/csi/volumeDevices/pv1/dev"
