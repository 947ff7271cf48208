"""A terminated pod's folder is removed without crossing a mount point (issue 25): a volume
still mounted under ``pods/<uid>`` (the volume manager unmounts it once the pod is gone) keeps
its data, and the volume manager's folders (its ``vol_data.json``, which a reconstruction
needs) are left to it; everything else goes. Root: a real bind mount, undone by the test."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from podvisor.services.syncloop.terminate import remove_pod_dir


@pytest.mark.skipif(os.geteuid() != 0, reason="a bind mount needs root")
def test_a_mounted_volume_under_the_pod_folder_is_left_whole(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "precious").write_text("data")
    pod = tmp_path / "pods" / "uid1"
    target = pod / "volumes" / "kubernetes.io~csi" / "pv1" / "mount"
    target.mkdir(parents=True)
    (pod / "volumes" / "kubernetes.io~csi" / "pv1" / "vol_data.json").write_text("{}")
    (pod / "volumes" / "kubernetes.io~empty-dir" / "e").mkdir(parents=True)
    (pod / "volumes" / "kubernetes.io~empty-dir" / "e" / "f").write_text("x")
    subprocess.run(["mount", "--bind", str(disk), str(target)], check=True)
    try:
        remove_pod_dir(pod)
        assert (disk / "precious").read_text() == "data"
        assert (target / "precious").exists()
        assert not (pod / "volumes" / "kubernetes.io~empty-dir").exists()
        assert (pod / "volumes" / "kubernetes.io~csi" / "pv1" / "vol_data.json").exists()
    finally:
        subprocess.run(["umount", str(target)], check=True)
    remove_pod_dir(pod)  # the volume manager's folder is still its own
    assert (pod / "volumes" / "kubernetes.io~csi" / "pv1" / "vol_data.json").exists()
    shutil.rmtree(pod / "volumes" / "kubernetes.io~csi")  # as the volume manager does
    remove_pod_dir(pod)
    assert not pod.exists()


def test_the_volume_plugins_folders_are_left_to_the_volume_manager(tmp_path: Path) -> None:
    """[issue 24] A FlexVolume driver's folder (``vendor~driver``) and the nfs/iscsi/fc ones
    wait for their unmount (a driver may keep files there rather than a mount)."""
    pod = tmp_path / "u1"
    for folder in ("example.com~lvm/data", "kubernetes.io~nfs/n", "kubernetes.io~empty-dir/e"):
        (pod / "volumes" / folder).mkdir(parents=True)
    (pod / "volumes" / "example.com~lvm" / "data" / "state").write_text("the driver's")
    remove_pod_dir(pod)
    assert (pod / "volumes" / "example.com~lvm" / "data" / "state").exists()
    assert (pod / "volumes" / "kubernetes.io~nfs" / "n").exists()
    assert not (pod / "volumes" / "kubernetes.io~empty-dir").exists()
