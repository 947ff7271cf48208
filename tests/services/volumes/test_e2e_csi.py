"""CSI end to end (root: the test driver makes real bind mounts): a driver found through the
plugin-registration folder (its CSINode entry, the Node's annotation), a pod with a claim on
a CSI PV (attach through a VolumeAttachment, stage, publish) and an inline csi volume
(publish only), the volume manager killed -9 between stage and publish (crash point
``volumes:csi.after_stage``): it stages again and publishes, nothing is missing and nothing
is mounted twice. ``volumesInUse``/``volumesAttached`` in the Node's status,
``/stats/summary``'s volume entries with ``pvcRef``. The pod deleted: unpublish, then
unstage, then the VolumeAttachment goes; the driver's call log is the proof of the order,
and no mount is left."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from podvisor.common.crashpoints import ENV_AT, ENV_ONCE_DIR
from tests.services.volumes.claimpods import (
    agent_config,
    claim,
    gone,
    mounts_under,
    pod_volumes,
    read,
    summary_auth,
)
from tests.support.csidriver import CsiDriver
from tests.support.kubeapi import ApiError, KubeApi
from tests.support.kubeapi.volumes import VolumeControllers
from tests.support.lifecycle import free_port

NODE = "e2e-csi"
DRIVER = "test.csi.podvisor.io"
UNIQUE = f"kubernetes.io/csi/{DRIVER}^vol-1"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")
SCRIPT = ("echo hello > {data}/file; echo scratch > {scratch}/file; echo ok > {marks}/ran; "
          "while true; do sleep 1; done")


@pytest.fixture
def short() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="pvcsi", dir="/tmp"))
    yield path
    if os.environ.get("PV_DEBUG"):
        shutil.copytree(path / "root" / "logs", "/tmp/csi-debug", dirs_exist_ok=True)
        shutil.copy(path / "drv" / "calls.jsonl", "/tmp/csi-debug/calls.jsonl")
    for point in reversed(mounts_under(path)):  # a failed test's leftovers
        subprocess.run(["umount", "-l", point], check=False)
    shutil.rmtree(path, ignore_errors=True)


def node_status(api: KubeApi) -> dict[str, Any]:
    try:
        return dict(api.store.get("nodes", "", NODE).get("status") or {})
    except ApiError:
        return {}


def test_csi_stage_publish_crash_and_teardown(api: KubeApi, controllers: VolumeControllers,
                                              agent: Any, wait_for: Callable[..., Any],
                                              tmp_path: Path, short: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    server = api
    controllers.attach = lambda va: (True, "")  # the external attacher
    root, once, marks = short / "root", short / "once", tmp_path / "marks"
    for d in (root / "plugins_registry", once, marks):
        d.mkdir(parents=True)
    driver = CsiDriver(DRIVER, short / "drv", root / "plugins_registry")
    try:
        _run(server, agent, wait_for, tmp_path, root, once, marks, driver, monkeypatch)
    finally:
        driver.stop()


def _run(server: KubeApi, agent: Any, wait_for: Callable[..., Any], tmp_path: Path,
         root: Path, once: Path, marks: Path, driver: CsiDriver,
         monkeypatch: pytest.MonkeyPatch) -> None:
    (driver.data / "vol-1").mkdir()
    server.store.create("csidrivers", "", {"metadata": {"name": DRIVER}, "spec": {
        "attachRequired": True, "podInfoOnMount": True, "fsGroupPolicy": "File",
        "volumeLifecycleModes": ["Persistent", "Ephemeral"]}})
    server.store.create("persistentvolumes", "", {"metadata": {"name": "pv-csi"}, "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
        "storageClassName": "csi", "csi": {"driver": DRIVER, "volumeHandle": "vol-1",
                                           "volumeAttributes": {"tier": "gold"}}}})
    server.store.create("persistentvolumeclaims", "default", claim("data-csi-0", "csi"))
    data, scratch = tmp_path / "c" / "data", tmp_path / "c" / "scratch"
    pod = server.create_pod("default", {"metadata": {"name": "csi-0"}, "spec": {
        "nodeName": NODE, "terminationGracePeriodSeconds": 1,
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-csi-0"}},
                    {"name": "scratch", "csi": {"driver": DRIVER,
                                                "volumeAttributes": {"size": "1Mi"}}},
                    {"name": "marks", "hostPath": {"path": str(marks)}}],
        "containers": [{"name": "c", "image": "host", "command": [
            "sh", "-c", SCRIPT.format(data=data, scratch=scratch, marks=marks)],
            "volumeMounts": [{"name": "data", "mountPath": str(data)},
                             {"name": "scratch", "mountPath": str(scratch)},
                             {"name": "marks", "mountPath": str(marks)}]}]}})
    uid = pod["metadata"]["uid"]
    port = free_port()
    monkeypatch.setenv(ENV_AT, "volumes:csi.after_stage")
    monkeypatch.setenv(ENV_ONCE_DIR, str(once))
    handle = agent(config=agent_config(
        server, tmp_path, NODE, rootDir=str(root), port=port,
        authentication=summary_auth(tmp_path)))
    wait_for(lambda: read(marks / "ran") == "ok", timeout=120, message="the pod running")
    assert (once / "volumes.csi.after_stage").exists(), "the crash point fired"
    assert handle.state("volumes")["restarts"] >= 1
    # registration: the driver told it is registered, its CSINode entry, the Node's annotation
    assert [c["registered"] for c in driver.calls("NotifyRegistrationStatus")][-1] is True
    csinode = server.store.get("csinodes", "", NODE)
    assert csinode["spec"]["drivers"] == [{"name": DRIVER, "nodeID": "test-node",
                                           "topologyKeys": ["topology.test.csi/node"],
                                           "allocatable": {"count": 16}}]
    node = server.store.get("nodes", "", NODE)
    assert json.loads(node["metadata"]["annotations"]["csi.volume.kubernetes.io/nodeid"]) == \
        {DRIVER: "test-node"}
    # stage (crash), stage again (idempotent), publish; the inline volume: publish only
    persistent = [(c["call"], c["code"]) for c in driver.calls(
        "NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume")
        if c["volume_id"] == "vol-1"]
    assert persistent == [("NodeStageVolume", "OK"), ("NodeStageVolume", "OK"),
                          ("NodePublishVolume", "OK")]
    [stage, _] = driver.calls("NodeStageVolume")
    [va] = server.store.list("volumeattachments", None)[0]
    assert va["spec"] == {"attacher": DRIVER, "nodeName": NODE,
                          "source": {"persistentVolumeName": "pv-csi"}}
    assert stage["context"] == {"tier": "gold", "csi.storage.k8s.io/pod.name": "csi-0",
                                "csi.storage.k8s.io/pod.namespace": "default",
                                "csi.storage.k8s.io/pod.uid": uid,
                                "csi.storage.k8s.io/serviceAccount.name": "default",
                                "csi.storage.k8s.io/ephemeral": "false"}
    # (published before the crash, it is published again after it: idempotent, one mount)
    inline = [c for c in driver.calls("NodePublishVolume") if c["volume_id"] != "vol-1"]
    assert len({c["volume_id"] for c in inline}) == 1 and all(
        c["staging"] == "" and c["context"]["csi.storage.k8s.io/ephemeral"] == "true"
        and c["code"] == "OK" for c in inline)
    # nothing missing, nothing twice: one staging mount, one mount per published volume
    volumes = root / "pods" / uid / "volumes" / "kubernetes.io~csi"
    staging = Path(stage["path"])
    assert sorted(mounts_under(root)) == sorted([str(staging), str(volumes / "pv-csi" / "mount"),
                                                 str(volumes / "scratch" / "mount")])
    assert read(driver.data / "vol-1" / "file") == "hello"
    # the Node's status and /stats/summary
    wait_for(lambda: node_status(server).get("volumesInUse") == [UNIQUE], timeout=30,
             message="volumesInUse")
    assert node_status(server)["volumesAttached"] == [{"name": UNIQUE, "devicePath": ""}]
    entries = wait_for(lambda: [v for v in pod_volumes(port, "csi-0") if v["name"] == "data"
                                and v["usedBytes"] >= len("hello\n")],
                       timeout=30, message="the claim's usage in /stats/summary")
    assert entries[0]["pvcRef"] == {"name": "data-csi-0", "namespace": "default"}
    assert entries[0]["capacityBytes"] > 0 and entries[0]["inodesUsed"] >= 2
    # the pod deleted: unpublish, then unstage, then the VolumeAttachment goes
    server.store.delete("pods", "default", "csi-0", grace=1)
    wait_for(gone(server, "pods", "csi-0"), timeout=60, message="the pod deleted")
    wait_for(lambda: not mounts_under(root), timeout=60, message="every mount undone")
    wait_for(lambda: not server.store.list("volumeattachments", None)[0], timeout=30,
             message="the VolumeAttachment deleted")
    calls = [(c["call"], c["volume_id"]) for c in driver.calls(
        "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume", "NodeStageVolume")]
    tail = calls[calls.index(("NodePublishVolume", "vol-1")) + 1:]
    assert ("NodeUnpublishVolume", "vol-1") in tail and tail[-1] == ("NodeUnstageVolume",
                                                                     "vol-1")
    assert tail.index(("NodeUnpublishVolume", "vol-1")) < tail.index(("NodeUnstageVolume",
                                                                      "vol-1"))
    assert not driver.calls("violation")
    assert not staging.exists() and not (root / "pods" / uid).exists()
    assert not (driver.data / inline[0]["volume_id"]).exists()  # the inline volume is gone
    wait_for(lambda: node_status(server).get("volumesInUse") == [], timeout=30)
