"""local PersistentVolumes end to end (root: real bind mounts, each removed by the agent, the
test checks and cleans up): the PV's directory bound into the pod's volume folder once its
nodeAffinity matches the Node, the pod's fsGroup applied (OnRootMismatch), a subPath made in
the claim, a claim mounted readOnly refusing writes; kill -9 of the volumes process while the
pod runs leaves the one mount as it was; the pod deleted, its mount and folders go."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.services.volumes.claimpods import (
    agent_config,
    claim,
    gone,
    host_path_pv,
    kill9,
    local_pv,
    log_lines,
    mounts_under,
    phase,
    read,
)
from tests.support.kubeapi import KubeApi

NODE = "e2e-local"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")
SCRIPT = ("touch {data}/file; ls -ld {data} > {marks}/mode; "
          "(echo x > {ro}/file && echo written || echo refused) > {marks}/ro; "
          "echo ok > {marks}/ran; while true; do sleep 1; done")


def test_local_pv_fs_group_sub_path_and_read_only(api: KubeApi, agent: Any,
                                                  wait_for: Callable[..., Any],
                                                  tmp_path: Path) -> None:
    disk, shared, marks = tmp_path / "disk", tmp_path / "shared", tmp_path / "marks"
    for d in (disk, shared, marks):
        d.mkdir()
    data, ro = tmp_path / "c" / "data", tmp_path / "c" / "ro"
    api.store.create("persistentvolumes", "", local_pv("pv-local", disk, NODE))
    api.store.create("persistentvolumes", "", host_path_pv("pv-shared", shared))
    api.store.create("persistentvolumeclaims", "default", claim("data", "local"))
    api.store.create("persistentvolumeclaims", "default", claim("shared"))
    pod = api.create_pod("default", {"metadata": {"name": "db"}, "spec": {
        "nodeName": NODE, "terminationGracePeriodSeconds": 1,
        "securityContext": {"fsGroup": 2000, "fsGroupChangePolicy": "OnRootMismatch"},
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "ro", "persistentVolumeClaim": {"claimName": "shared",
                                                             "readOnly": True}},
                    {"name": "marks", "hostPath": {"path": str(marks)}}],
        "containers": [{"name": "c", "image": "host", "command": ["sh", "-c", SCRIPT.format(
            data=data, ro=ro, marks=marks)], "volumeMounts": [
            {"name": "data", "mountPath": str(data), "subPath": "sub"},
            {"name": "ro", "mountPath": str(ro)},
            {"name": "marks", "mountPath": str(marks)}]}]}})
    uid = pod["metadata"]["uid"]
    handle = agent(config=agent_config(api, tmp_path, NODE))
    wait_for(lambda: read(marks / "ran") == "ok", timeout=90, message="the pod running")
    folder = handle.paths.pods_dir / uid / "volumes" / "kubernetes.io~local-volume" / "pv-local"
    assert mounts_under(folder) == [str(folder.resolve())]
    # fsGroup on the volume's root (group, g+rwx, setgid); the subPath made inside it
    st = os.stat(disk)
    assert st.st_gid == 2000 and st.st_mode & stat.S_ISGID and st.st_mode & 0o070 == 0o070
    assert (disk / "sub" / "file").exists()
    assert read(marks / "ro") == "refused" and not (shared / "file").exists()
    assert phase(api, "persistentvolumeclaims", "data") == "Bound"
    # kill -9 of the process that mounts: the restart reconstructs the mount, adds none
    kill9(handle, "volumes", wait_for)
    wait_for(lambda: sum(1 for line in log_lines(handle) if line.get("event") ==
                         "volumes.mount" and line.get("pod_uid") == uid
                         and line.get("volume") == "data") >= 2,
             timeout=30, message="the restarted volumes process mounting (again) what it found")
    assert mounts_under(folder) == [str(folder.resolve())]
    assert read(marks / "ran") == "ok"
    api.store.delete("pods", "default", "db", grace=1)
    wait_for(gone(api, "pods", "db"), timeout=60, message="the pod deleted")
    wait_for(lambda: not mounts_under(handle.paths.pods_dir), timeout=30,
             message="the local volume unmounted")
    wait_for(lambda: not (handle.paths.pods_dir / uid).exists(), timeout=30,
             message="the pod's folder removed")
    assert (disk / "sub" / "file").exists()  # the data stays on the PV
