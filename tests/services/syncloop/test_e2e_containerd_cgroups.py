"""End to end on containerd: pods' cgroups under `cgroupRoot`.

The real agent with `runtimeEndpoint: <containerd>` and a per-test `cgroupRoot`
(`/podvisor-test-<random>`): the container's process sits in its QoS class's folder,
`<cgroupRoot>/besteffort/pod<uid>/...` for this pod without resources, on
every hierarchy it belongs to (its /proc/<pid>/cgroup), and once the manifest is deleted the
pod's folders are gone on every mounted hierarchy; an empty `pod<uid>` folder no pod has (a
crash leftover) is removed at housekeeping, other folders under the root are left alone.
Skipped with the reason when no containerd is available (`containerd_or_skip()`)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml

from podvisor.services.cri import CriError, new_runtime_client
from podvisor.services.cri.client import RuntimeClient
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.cgroupfs import new_cgroup_fs
from podvisor.services.syncloop.podcgroups import hierarchy_dirs, parse_mountinfo
from tests.support.containerd import ContainerdHandle, containerd_or_skip
from tests.support.lifecycle import (
    agent_config,
    all_running,
    container_pid,
    free_port,
    get_pods,
)

pytestmark = pytest.mark.containerd


@pytest.fixture(scope="module")
def containerd() -> ContainerdHandle:
    """Module scope: the session's containerd starts before the per-test leak snapshot."""
    return containerd_or_skip()


def folders(cgroup_path: str) -> list[str]:
    """The path's folder on every mounted hierarchy (v1 controllers and v2), existing or not."""
    return hierarchy_dirs(parse_mountinfo(new_cgroup_fs().mountinfo()), cgroup_path)


def pod_manifest(image: str, marker: str) -> dict[str, Any]:
    loop = "trap 'exit 0' TERM; while :; do sleep 1; done"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cg"},
            "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 2,
                     "containers": [{"name": "c", "image": image,
                                     "imagePullPolicy": "IfNotPresent",
                                     "command": ["sh", "-c", loop, marker]}]}}


def cgroup_lines(pid: int) -> dict[str, str]:
    """hierarchy (controllers, or "" for v2) -> path, from /proc/<pid>/cgroup."""
    out = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        out[controllers] = path
    return out


def ours(cri: RuntimeClient, uid: str) -> list[Any]:
    return [s for s in cri.list_pod_sandbox() if s.labels.get(L.POD_UID) == uid]


def clean(cri: RuntimeClient, uid: str) -> None:
    for sandbox in ours(cri, uid) if uid else []:
        try:
            cri.stop_pod_sandbox(sandbox.id)
            cri.remove_pod_sandbox(sandbox.id)
        except CriError:
            pass


@pytest.mark.timeout(150)
def test_pod_cgroups_under_root_and_removed_with_the_pod(
        agent: Any, containerd: ContainerdHandle, manifests: Path, cgroup_root: str,
        wait_for: Any) -> None:
    marker = f"pv-cg-{secrets.token_hex(4)}"
    leftover = folders(f"{cgroup_root}/podcrashed{secrets.token_hex(4)}")
    keep = folders(f"{cgroup_root}/notapod")
    for d in leftover + keep:
        os.makedirs(d)
    (manifests / "cg.yaml").write_text(yaml.safe_dump(pod_manifest(containerd.image, marker)))
    port = free_port()
    cri = new_runtime_client(containerd.endpoint, timeout=30.0)
    uid = ""
    try:
        handle = agent(config=agent_config(manifests, port, runtimeEndpoint=containerd.endpoint,
                                           cgroupRoot=cgroup_root))
        body = wait_for(lambda: (b := get_pods(port)) and all_running(b, {"cg"}) and b,
                        90.0, 0.2, "the pod Running in /pods")
        uid = body["items"][0]["metadata"]["uid"]
        pod_path = f"{cgroup_root}/besteffort/pod{uid}"  # no resources: BestEffort
        pid = wait_for(lambda: container_pid(marker), 30.0, 0.1, "the container's process")
        lines = cgroup_lines(pid)
        placed = {h: p for h, p in lines.items() if p.startswith(pod_path + "/")}
        assert placed == lines and "memory" in placed, lines  # every hierarchy, v2 too
        assert [s.labels.get(L.POD_UID) for s in ours(cri, uid)] == [uid]
        existing = [d for d in folders(pod_path) if os.path.isdir(d)]
        assert len(existing) >= len(placed), existing
        wait_for(lambda: not any(os.path.exists(d) for d in leftover), 30.0, 0.2,
                 "the leftover pod folder removed at housekeeping")
        assert all(os.path.isdir(d) for d in keep)        # not a pod folder: left alone

        (manifests / "cg.yaml").unlink()
        wait_for(lambda: not ours(cri, uid), 60.0, 0.2, "the sandbox removed")
        wait_for(lambda: not [d for d in folders(pod_path) if os.path.exists(d)], 30.0, 0.2,
                 f"{pod_path} removed on every hierarchy")
        assert all(os.path.isdir(d) for d in folders(cgroup_root))  # the root stays
        assert handle.stop() == 0
    finally:
        clean(cri, uid)
        cri.close()
