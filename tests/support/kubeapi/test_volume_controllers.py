"""The stand-in's volume controllers (``volumes.py``): binding as the PV controller writes it,
provisioning for a registered class, reclaim, the ephemeral-volume controller and the garbage
collection of pod-owned claims, the CSIDriver's defaults."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kubeapi import ApiError, KubeApi
from tests.support.kubeapi.volumes import VolumeControllers


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[KubeApi, VolumeControllers]]:
    server = KubeApi(tmp_path / "kubeapi")
    controllers = VolumeControllers(server).start()
    yield server, controllers
    controllers.stop()


def get(api: KubeApi, resource: str, name: str, ns: str = "") -> dict[str, Any]:
    try:
        return api.store.get(resource, ns, name)
    except ApiError:
        return {}


def test_binding_provisioning_reclaim_and_ephemeral(
        api: tuple[KubeApi, VolumeControllers], wait_for: Callable[..., Any]) -> None:
    server, controllers = api
    server.store.create("persistentvolumes", "", {"metadata": {"name": "big"}, "spec": {
        "capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"],
        "storageClassName": "manual", "hostPath": {"path": "/x"}}})
    server.store.create("persistentvolumes", "", {"metadata": {"name": "small"}, "spec": {
        "capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"],
        "storageClassName": "manual", "hostPath": {"path": "/y"}}})
    for name in ("big", "small"):
        wait_for(lambda name=name: get(server, "persistentvolumes", name).get(
            "status", {}).get("phase") == "Available", timeout=10)
    claim = server.store.create("persistentvolumeclaims", "default", {
        "metadata": {"name": "c1"}, "spec": {"accessModes": ["ReadWriteOnce"],
                                             "storageClassName": "manual",
                                             "resources": {"requests": {"storage": "1Gi"}}}})
    wait_for(lambda: get(server, "persistentvolumeclaims", "c1", "default").get(
        "status", {}).get("phase") == "Bound", timeout=10)
    bound = get(server, "persistentvolumeclaims", "c1", "default")
    assert bound["spec"]["volumeName"] == "small"  # the smallest that fits
    assert bound["status"]["capacity"] == {"storage": "2Gi"}
    pv = get(server, "persistentvolumes", "small")
    assert pv["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
    assert pv["status"]["phase"] == "Bound" and pv["spec"]["persistentVolumeReclaimPolicy"] \
        == "Retain"
    server.store.delete("persistentvolumeclaims", "default", "c1")
    wait_for(lambda: get(server, "persistentvolumes", "small").get("status", {}).get(
        "phase") == "Released", timeout=10)
    # an ephemeral volume: a claim for the pod, provisioned, gone with the pod and its PV
    server.store.create("storageclasses", "", {"metadata": {"name": "fast"},
                                               "provisioner": "x", "reclaimPolicy": "Delete"})
    controllers.provisioners["fast"] = lambda c: {"hostPath": {"path": "/z"}}
    pod = server.create_pod("default", {"metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "c", "image": "i"}],
        "volumes": [{"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
            "resources": {"requests": {"storage": "1Gi"}}}}}}]}})
    wait_for(lambda: get(server, "persistentvolumeclaims", "p-e", "default").get(
        "status", {}).get("phase") == "Bound", timeout=10)
    made = get(server, "persistentvolumeclaims", "p-e", "default")
    assert made["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    assert made["spec"]["volumeName"] == f"pvc-{made['metadata']['uid']}"
    server.store.delete("pods", "default", "p", grace=0)
    wait_for(lambda: not get(server, "persistentvolumeclaims", "p-e", "default"), timeout=10)
    wait_for(lambda: made["spec"]["volumeName"] in controllers.deleted, timeout=10)


def test_csidriver_defaults(api: tuple[KubeApi, VolumeControllers]) -> None:
    server, _ = api
    driver = server.store.create("csidrivers", "", {"metadata": {"name": "d"}, "spec": {}})
    assert driver["spec"] == {"attachRequired": True, "podInfoOnMount": False,
                              "fsGroupPolicy": "ReadWriteOnceWithFSType",
                              "volumeLifecycleModes": ["Persistent"],
                              "requiresRepublish": False, "storageCapacity": False}
