"""Raw block volumes end to end (issue 24; root, a real loop device the test makes): a claim
bound to a ``volumeMode: Block`` local PV whose path is the loop device, used by a pod's
``volumeDevices``. The volumes process maps it (the device bound on the global map path, the
pod's symlink to it), the sync loop gives it to the container as a CRI device, and the
container (busybox from a local registry: its own root and /dev) writes bytes through
``/dev/xvda`` that the test reads back from the loop device's backing file. A claim whose PV is
``Filesystem`` used in ``volumeDevices`` fails with the kubelet's words (a FailedMount event),
the pod waiting. The pod deleted, the map goes. On the embedded runtime and containerd."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.services.volumes.claimpods import (
    agent_config,
    claim,
    events,
    gone,
    kill9,
    local_pv,
    mounts_under,
    read,
    waiting_reason,
)
from tests.support.csidriver import CsiDriver
from tests.support.kubeapi import KubeApi
from tests.support.loopdev import loop_device, read_back
from tests.support.registry import registries

NODE = "e2e-block"
DATA = b"podvisor-e2e-raw-block"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="loop devices and binds need root")
SCRIPT = (f"printf {DATA.decode()} | dd of=/dev/xvda conv=fsync 2>/dev/null && "
          "echo ok > {marks}/ran; while true; do sleep 1; done")


def test_a_block_claim_is_a_device_in_the_container(pod_runtime: dict[str, Any], api: KubeApi,
                                                    agent: Any, wait_for: Callable[..., Any],
                                                    tmp_path: Path) -> None:
    """On both runtimes (the embedded one runs busybox from a local registry: an image of its
    own root and /dev; containerd its test image)."""
    backing, marks, disk = tmp_path / "disk.img", tmp_path / "marks", tmp_path / "fsdisk"
    marks.mkdir()
    disk.mkdir()
    with contextlib.ExitStack() as stack:
        dev = stack.enter_context(loop_device(backing))
        image = pod_runtime["image"]
        if image == "host":
            anon, _ = stack.enter_context(registries(tmp_path / "reg"))
            image = f"{anon.host}/podvisor/busybox:1"
        block_pv = local_pv("pv-block", Path(dev), NODE)
        block_pv["spec"]["volumeMode"] = "Block"
        api.store.create("persistentvolumes", "", block_pv)
        api.store.create("persistentvolumeclaims", "default",
                         claim("blk", "local", volumeMode="Block"))
        api.store.create("persistentvolumes", "", local_pv("pv-fs", disk, NODE))
        api.store.create("persistentvolumeclaims", "default", claim("fs", "local"))
        pod = api.create_pod("default", {"metadata": {"name": "db"}, "spec": {
            "nodeName": NODE, "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "blk"}},
                        {"name": "marks", "hostPath": {"path": str(marks)}}],
            "containers": [{"name": "c", "image": image, "command": [
                "sh", "-c", SCRIPT.format(marks=marks)],
                "volumeDevices": [{"name": "data", "devicePath": "/dev/xvda"}],
                "volumeMounts": [{"name": "marks", "mountPath": str(marks)}]}]}})
        api.create_pod("default", {"metadata": {"name": "wrong"}, "spec": {
            "nodeName": NODE, "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "fs"}}],
            "containers": [{"name": "c", "image": "host", "command": ["sleep", "600"],
                            "volumeDevices": [{"name": "data", "devicePath": "/dev/xvdz"}]}]}})
        uid = pod["metadata"]["uid"]
        handle = agent(config=agent_config(api, tmp_path, NODE, **pod_runtime["config"]))
        wait_for(lambda: read(marks / "ran") == "ok", timeout=120,
                 message="the pod writing through its block device")
        assert read_back(backing, len(DATA)) == DATA
        root = handle.paths.pods_dir.parent
        link = handle.paths.pods_dir / uid / "volumeDevices" / "kubernetes.io~local-volume" / \
            "pv-block"
        bind = root / "plugins" / "kubernetes.io" / "local-volume" / "volumeDevices" / \
            "pv-block" / uid
        assert os.readlink(link) == dev and mounts_under(bind) == [str(bind.resolve())]
        message = "volume data has volumeMode Filesystem, but is specified in volumeDevices"
        wait_for(lambda: any(message in e.get("message", "") and
                             e["involvedObject"]["name"] == "wrong"
                             for e in events(api, "FailedMount")),
                 timeout=60, message="the mismatch's FailedMount event")
        wait_for(lambda: waiting_reason(api, "wrong") == "ContainerCreating", timeout=30,
                 message="the pod waiting for its volume")
        for name in ("db", "wrong"):
            api.store.delete("pods", "default", name, grace=1)
            wait_for(gone(api, "pods", name), timeout=60, message=f"pod {name} deleted")
        wait_for(lambda: not mounts_under(bind.parent.parent), timeout=30,
                 message="the device unmapped")
        assert not os.path.lexists(link) and not bind.exists()
        assert os.path.exists(dev)  # the node's device is left as it was


DRIVER = "block.csi.podvisor.io"


@pytest.fixture
def short() -> Iterator[Path]:
    """A short rootDir (unix socket paths) for the CSI test; its leftovers unmounted."""
    path = Path(tempfile.mkdtemp(prefix="pvblk", dir="/tmp"))
    yield path
    if os.environ.get("PV_DEBUG"):  # keep the agent's logs and the driver's calls
        shutil.copytree(path, "/tmp/pvblk-debug", dirs_exist_ok=True, symlinks=True,
                        ignore_dangling_symlinks=True,
                        ignore=shutil.ignore_patterns("*.sock", "*.img"))
    for point in reversed(mounts_under(path)):
        subprocess.run(["umount", "-l", point], check=False)
    shutil.rmtree(path, ignore_errors=True)


def test_a_csi_block_volume_is_staged_published_and_mapped(
        api: KubeApi, agent: Any, wait_for: Callable[..., Any], tmp_path: Path,
        short: Path) -> None:
    """A CSI PV of volumeMode Block (the test driver: its volume's ``device`` a loop device):
    attached, staged and published with block access at the kubelet's paths
    (``volumeDevices/staging/<pv>``, ``volumeDevices/publish/<pv>/<pod uid>``), the publish
    path mapped into the pod; kill -9 of the volumes process finds it all again (one bind
    each, the container still writing); the pod deleted: unpublish, then unstage."""
    backing, marks = tmp_path / "disk.img", tmp_path / "marks"
    marks.mkdir()
    root = short / "root"
    (root / "plugins_registry").mkdir(parents=True)
    with contextlib.ExitStack() as stack:
        dev = stack.enter_context(loop_device(backing))
        anon, _ = stack.enter_context(registries(tmp_path / "reg"))
        driver = CsiDriver(DRIVER, short / "drv", root / "plugins_registry")
        stack.callback(driver.stop)
        (driver.data / "blk-1").mkdir()
        os.symlink(dev, driver.data / "blk-1" / "device")
        api.store.create("csidrivers", "", {"metadata": {"name": DRIVER}, "spec": {
            "attachRequired": False, "volumeLifecycleModes": ["Persistent"]}})
        api.store.create("persistentvolumes", "", {"metadata": {"name": "pv-csi-blk"}, "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "volumeMode": "Block", "storageClassName": "csi",
            "csi": {"driver": DRIVER, "volumeHandle": "blk-1"}}})
        api.store.create("persistentvolumeclaims", "default",
                         claim("blk", "csi", volumeMode="Block"))
        pod = api.create_pod("default", {"metadata": {"name": "db"}, "spec": {
            "nodeName": NODE, "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "blk"}},
                        {"name": "marks", "hostPath": {"path": str(marks)}}],
            "containers": [{"name": "c", "image": f"{anon.host}/podvisor/busybox:1",
                            "command": ["sh", "-c", SCRIPT.format(marks=marks)],
                            "volumeDevices": [{"name": "data", "devicePath": "/dev/xvda"}],
                            "volumeMounts": [{"name": "marks", "mountPath": str(marks)}]}]}})
        uid = pod["metadata"]["uid"]
        handle = agent(config=agent_config(api, tmp_path, NODE, rootDir=str(root)))
        wait_for(lambda: read(marks / "ran") == "ok", timeout=120,
                 message="the pod writing through its CSI block device")
        assert read_back(backing, len(DATA)) == DATA
        block = root / "plugins" / "kubernetes.io" / "csi" / "volumeDevices"
        staging, publish = block / "staging" / "pv-csi-blk", block / "publish" / "pv-csi-blk"
        bind = block / "pv-csi-blk" / "dev" / uid
        link = root / "pods" / uid / "volumeDevices" / "kubernetes.io~csi" / "pv-csi-blk"
        # every call at the kubelet's paths (a restart of the process under load calls again)
        stages = driver.calls("NodeStageVolume")
        assert stages and {(c["path"], c["code"]) for c in stages} == {(str(staging), "OK")}
        published = driver.calls("NodePublishVolume")
        assert published and {(c["path"], c["staging"]) for c in published} == {
            (str(publish / uid), str(staging))}
        before = len(published)
        assert os.readlink(link) == str(publish / uid)
        assert mounts_under(publish) == [str(publish / uid)] and mounts_under(bind) == [str(bind)]
        kill9(handle, "volumes", wait_for)
        wait_for(lambda: len(driver.calls("NodePublishVolume")) > before, timeout=30,
                 message="the restarted volumes process publishing again what it found")
        assert mounts_under(publish) == [str(publish / uid)] and mounts_under(bind) == [str(bind)]
        api.store.delete("pods", "default", "db", grace=1)
        wait_for(gone(api, "pods", "db"), timeout=60, message="the pod deleted")
        wait_for(lambda: driver.calls("NodeUnstageVolume"), timeout=30,
                 message="the device unstaged")
        order = [c["call"] for c in driver.calls("NodeUnpublishVolume", "NodeUnstageVolume")]
        assert order[-2:] == ["NodeUnpublishVolume", "NodeUnstageVolume"], order
        # the folders go after the calls return: waited for, not read at once
        wait_for(lambda: not mounts_under(root) and not os.path.lexists(link)
                 and not staging.exists() and not (block / "pv-csi-blk").exists(), timeout=30,
                 message="the maps, the pod's link and the staging folder removed")
