"""Generic ephemeral volumes end to end (root: a local PV's bind mount): the stand-in's
ephemeral-volume controller makes the claim ``<pod>-<volume>`` from the pod's template,
controlled by the pod; a provisioner binds it to a new local PV; the volume manager mounts it
once the claim is there and bound; the pod deleted, it is unmounted, and the claim (garbage
collected) and its PV (reclaim policy Delete) go."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.services.volumes.claimpods import (
    agent_config,
    counting_pod,
    gone,
    local_pv,
    mounts_under,
    phase,
    read,
)
from tests.support.kubeapi import KubeApi
from tests.support.kubeapi.volumes import VolumeControllers

NODE = "e2e-ephemeral"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")


def test_ephemeral_volume_is_made_mounted_and_cleaned_up(
        api: KubeApi, controllers: VolumeControllers, agent: Any,
        wait_for: Callable[..., Any], tmp_path: Path) -> None:
    server = api
    disks, marks, mount = tmp_path / "disks", tmp_path / "marks", tmp_path / "c" / "scratch"
    disks.mkdir()
    marks.mkdir()

    def provision(claim: dict[str, Any]) -> dict[str, Any]:
        path = disks / claim["metadata"]["uid"]
        path.mkdir()
        return local_pv("", path, NODE)["spec"]

    server.store.create("storageclasses", "", {"metadata": {"name": "local-ephemeral"},
                                               "provisioner": "test.podvisor.io/local",
                                               "reclaimPolicy": "Delete"})
    controllers.provisioners["local-ephemeral"] = provision
    volume = {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
        "metadata": {"labels": {"type": "scratch"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-ephemeral",
                 "resources": {"requests": {"storage": "1Gi"}}}}}}
    pod = server.create_pod("default", counting_pod("eph-0", NODE, volume, mount, marks))
    uid = pod["metadata"]["uid"]
    handle = agent(config=agent_config(server, tmp_path, NODE))
    wait_for(lambda: read(marks / "seen") == "0", timeout=90, message="the pod running")
    claim = server.store.get("persistentvolumeclaims", "default", "eph-0-scratch")
    assert claim["metadata"]["ownerReferences"][0]["uid"] == uid
    assert claim["metadata"]["labels"] == {"type": "scratch"}
    pv = claim["spec"]["volumeName"]
    assert phase(server, "persistentvolumes", pv) == "Bound"
    folder = handle.paths.pods_dir / uid / "volumes" / "kubernetes.io~local-volume" / pv
    assert mounts_under(handle.paths.pods_dir) == [str(folder.resolve())]
    [disk] = disks.iterdir()
    assert read(disk / "count") == "1"
    server.store.delete("pods", "default", "eph-0", grace=1)
    wait_for(gone(server, "pods", "eph-0"), timeout=60, message="the pod deleted")
    wait_for(lambda: not mounts_under(handle.paths.pods_dir), timeout=30,
             message="the ephemeral volume unmounted")
    wait_for(gone(server, "persistentvolumeclaims", "eph-0-scratch"), timeout=30,
             message="the claim collected with its pod")
    wait_for(lambda: pv in controllers.deleted, timeout=30, message="its PV deleted")
    wait_for(lambda: not (handle.paths.pods_dir / uid).exists(), timeout=30,
             message="the pod's folder removed")
