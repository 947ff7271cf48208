"""The volume manager's pass (``VolumeManager.step``) with a fake API and the fake mounter:
a pod waits (not ready, the populator's reason, one event) until its claim is bound, then its
local volume is bound and published ready with its host path; nothing is unmounted before the
desired state is synced; the pod gone, its volume is unmounted; a failing mount backs off; a
CSI volume's VolumeAttachment waited for, its attach error a FailedAttachVolume event, the
error cleared once attached."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from podvisor.common.logs import MemoryLogger
from podvisor.ipc.volumemaps import NODE_KEY
from podvisor.services.pod import Pod, pod_from_dict
from podvisor.services.volumes.manager import VolumeManager
from podvisor.services.volumes.mounter import FakeMounter
from podvisor.services.volumes.operations import Operations, attachment_name
from podvisor.services.volumes.resolve import STORAGE, Resolver
from podvisor.services.volumes.spec import VolumePaths
from tests.services.volumes.test_resolve import PVC, FakeApi, bound_claim, pv


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, reason: str, message: str, obj: Any) -> None:
        self.seen.append((reason, message))


def claim_pod() -> Pod:
    return pod_from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "db", "namespace": "default", "uid": "u1"}, "spec": {
        "containers": [{"name": "c", "image": "host"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}},
        api_objects=True).pod


def test_a_pass_from_unbound_to_mounted_to_gone(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    api = FakeApi({f"{PVC}/data": {**bound_claim(), "status": {"phase": "Pending"}}})
    paths, mounter, events = VolumePaths(tmp_path / "root"), FakeMounter(), Events()
    manager = VolumeManager(paths, Resolver(api, "n1"), Operations(
        paths, mounter, None, None, "n1"),  # type: ignore[arg-type]
        None, MemoryLogger(), events, lambda: 1000.0, stats_period=60.0)
    pod = claim_pod()
    out = manager.step(0.0, {"u1": pod}, synced=False)
    data = out.pods["u1"].volumes["data"]
    assert not data.ready and data.reason == "FailedMount" and "PVC is not bound" in data.message
    assert out.next_at == 1.0 and not out.node.synced
    manager.step(1.0, {"u1": pod}, synced=False)  # the same reason again: no second event
    assert len(events.seen) == 1
    api.objects[f"{PVC}/data"] = bound_claim()
    api.objects["/api/v1/persistentvolumes/pv1"] = pv({"local": {"path": str(disk)}})
    out = manager.step(2.0, {"u1": pod}, synced=False)
    data = out.pods["u1"].volumes["data"]
    folder = paths.pods / "u1" / "volumes" / "kubernetes.io~local-volume" / "pv1"
    assert data.ready and data.host_path == str(folder) and data.claim == "data"
    assert data.stats is not None  # the first pass past the period read the usage
    assert [m.path for m in mounter.mounts()] == [str(folder)]
    # the pod gone before the desired state synced: nothing is torn down yet
    out = manager.step(3.0, {}, synced=False)
    assert mounter.mounts() and not out.pods
    out = manager.step(4.0, {}, synced=True)
    assert not mounter.mounts() and out.node.synced and NODE_KEY == "_node"


def test_a_failing_mount_backs_off(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    api = FakeApi({f"{PVC}/data": bound_claim(),
                   "/api/v1/persistentvolumes/pv1": pv({"local": {"path": str(disk)}})})
    paths, mounter, events = VolumePaths(tmp_path / "root"), FakeMounter(), Events()
    manager = VolumeManager(paths, Resolver(api, "n1"), Operations(
        paths, mounter, None, None, "n1"),  # type: ignore[arg-type]
        None, MemoryLogger(), events, lambda: 1000.0)
    folder = str(paths.pods / "u1" / "volumes" / "kubernetes.io~local-volume" / "pv1")
    mounter.fail[folder] = OSError(1, "Operation not permitted")
    pod = claim_pod()
    out = manager.step(0.0, {"u1": pod}, synced=True)
    assert "MountVolume.SetUp failed" in out.pods["u1"].volumes["data"].message
    assert events.seen[0][0] == "FailedMount"
    manager.step(0.2, {"u1": pod}, synced=True)  # within its 0.5 s back-off: not tried
    assert [c for c in mounter.calls if c[0] == "bind"] == [("bind", folder)]
    out = manager.step(0.6, {"u1": pod}, synced=True)
    assert out.pods["u1"].volumes["data"].ready


class AttachApi(FakeApi):
    """The fake API that also makes objects (a VolumeAttachment), as the attach step asks."""

    def create(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self.objects[f"{path}/{body['metadata']['name']}"] = dict(body)
        return body

    def delete(self, path: str) -> None:
        self.objects.pop(path, None)


class NoDrivers:
    def client(self, driver: str) -> Any:
        raise LookupError(driver)


def test_an_attach_error_is_failed_attach_volume_then_mount_waits_for_the_driver(
        tmp_path: Path) -> None:
    api = AttachApi({f"{PVC}/data": bound_claim(), "/api/v1/persistentvolumes/pv1": pv(
        {"csi": {"driver": "d", "volumeHandle": "h"}})})  # no CSIDriver: attach required
    paths, mounter, events = VolumePaths(tmp_path / "root"), FakeMounter(), Events()
    manager = VolumeManager(paths, Resolver(api, "n1"), Operations(
        paths, mounter, NoDrivers(), api, "n1"), None, MemoryLogger(), events, lambda: 1000.0)
    pod = claim_pod()
    out = manager.step(0.0, {"u1": pod}, synced=True)
    data = out.pods["u1"].volumes["data"]
    assert not data.ready and data.reason == "" and "to be attached" in data.message
    assert not events.seen  # waiting for the attacher is not a failure
    va_path = f"{STORAGE}/volumeattachments/{attachment_name('h', 'd', 'n1')}"
    va = api.objects[va_path]
    assert va["spec"] == {"attacher": "d", "nodeName": "n1",
                          "source": {"persistentVolumeName": "pv1"}}
    api.objects[va_path] = {**va, "status": {"attached": False,
                                             "attachError": {"message": "disk busy"}}}
    out = manager.step(1.0, {"u1": pod}, synced=True)
    data = out.pods["u1"].volumes["data"]
    assert data.reason == "FailedAttachVolume" and "disk busy" in data.message
    assert events.seen == [("FailedAttachVolume", data.message)]
    assert out.node.in_use == ("kubernetes.io/csi/d^h",) and not out.node.attached
    api.objects[va_path] = {**va, "status": {"attached": True}}
    out = manager.step(5.0, {"u1": pod}, synced=True)  # past its back-off: attached
    data = out.pods["u1"].volumes["data"]
    assert out.node.attached[0].name == "kubernetes.io/csi/d^h"
    assert data.reason == "" and "waiting for the volume" in data.message  # the error is past
    out = manager.step(6.0, {"u1": pod}, synced=True)  # stage next: no driver registered
    data = out.pods["u1"].volumes["data"]
    assert data.reason == "FailedMount" and "not found in the list of registered CSI" \
        in data.message and events.seen[-1] == ("FailedMount", data.message)
