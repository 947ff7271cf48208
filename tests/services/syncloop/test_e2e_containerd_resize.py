"""In-place resize end to end on containerd (issue 24): a static pod (a manifest with its own
``metadata.uid``, so an edit is the same pod) whose CPU and memory are edited is resized, not
restarted: the same container (ID, process), no restart counted, and containerd's runc rewrote
the container's cgroup (cpu.cfs_quota_us, memory.limit_in_bytes) from UpdateContainerResources;
the pod's own cgroup too; ``/pods`` shows the new ``resources`` and ``allocatedResources``. An
edit that lowers a memory limit under NotRequired is refused (PodResizePending Infeasible, the
API server's message, which pods of other sources get from the sync loop) and changes nothing.
Skipped with the reason when no containerd is available (``containerd_or_skip()``)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.containerd import ContainerdHandle, containerd_or_skip
from tests.support.lifecycle import (
    agent_config,
    all_running,
    container_pid,
    free_port,
    get_pods,
)

pytestmark = pytest.mark.containerd
MI = 1 << 20


@pytest.fixture(scope="module")
def containerd() -> ContainerdHandle:
    return containerd_or_skip()


def manifest(image: str, marker: str, uid: str, cpu_limit: str, mem_limit: str
             ) -> dict[str, Any]:
    loop = "trap 'exit 0' TERM; while :; do sleep 1; done"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rs", "uid": uid},
            "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 2,
                     "containers": [{
                         "name": "c", "image": image, "imagePullPolicy": "IfNotPresent",
                         "command": ["sh", "-c", loop, marker],
                         "resources": {"requests": {"cpu": "100m", "memory": "32Mi"},
                                       "limits": {"cpu": cpu_limit, "memory": mem_limit}},
                         "resizePolicy": [
                             {"resourceName": "cpu", "restartPolicy": "NotRequired"},
                             {"resourceName": "memory", "restartPolicy": "NotRequired"}]}]}}


def cgroup_file(pid: int, controller: str, file: str) -> Path:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            mount = next(m.split()[1] for m in Path("/proc/self/mounts").read_text().splitlines()
                         if m.split()[2] == "cgroup" and controller in m.split()[3].split(","))
            return Path(mount) / path.lstrip("/") / file
    raise AssertionError(f"{pid} has no {controller} cgroup")


def read_int(path: Path) -> int:
    return int(path.read_text().strip())


def the_pod(port: int) -> dict[str, Any]:
    body = get_pods(port) or {}
    return next(iter(body.get("items", [])), {})


def container(port: int) -> dict[str, Any]:
    cs = the_pod(port).get("status", {}).get("containerStatuses") or [{}]
    return cs[0]  # type: ignore[no-any-return]


def cond(port: int, ctype: str) -> dict[str, Any]:
    conds = the_pod(port).get("status", {}).get("conditions") or []
    return next((c for c in conds if c["type"] == ctype), {})


@pytest.mark.timeout(200)
def test_a_static_pod_edit_of_cpu_and_memory_is_resized_in_place_on_containerd(
        agent: Any, containerd: ContainerdHandle, manifests: Path, cgroup_root: str,
        wait_for: Any) -> None:
    if not Path("/sys/fs/cgroup/memory").is_dir():
        pytest.skip("the cgroup files read here are cgroup v1's")
    marker = f"pv-rs-{secrets.token_hex(4)}"
    uid = f"rs-{secrets.token_hex(6)}"
    path = manifests / "rs.yaml"
    path.write_text(yaml.safe_dump(manifest(containerd.image, marker, uid, "200m", "64Mi")))
    port = free_port()
    handle = agent(config=agent_config(manifests, port, runtimeEndpoint=containerd.endpoint,
                                       cgroupRoot=cgroup_root))
    wait_for(lambda: all_running(get_pods(port), {"rs"}), 90.0, 0.2, "rs Running")
    pid = wait_for(lambda: container_pid(marker), 30.0, 0.1, "the container's process")
    cid = container(port)["containerID"]
    quota = cgroup_file(pid, "cpu", "cpu.cfs_quota_us")
    limit = cgroup_file(pid, "memory", "memory.limit_in_bytes")
    assert (read_int(quota), read_int(limit)) == (20_000, 64 * MI)

    path.write_text(yaml.safe_dump(manifest(containerd.image, marker, uid, "500m", "128Mi")))

    def resized() -> bool:
        cs = container(port)
        return (cs.get("resources", {}).get("limits") == {"cpu": "500m", "memory": "128Mi"}
                and not cond(port, "PodResizeInProgress"))

    wait_for(resized, 60.0, 0.2, "the container's new limits in /pods")
    assert container(port)["containerID"] == cid and container(port)["restartCount"] == 0
    assert container_pid(marker) == pid
    assert (read_int(quota), read_int(limit)) == (50_000, 128 * MI)
    assert container(port)["allocatedResources"] == {"cpu": "100m", "memory": "32Mi"}
    pod_limit = limit.parent.parent / "memory.limit_in_bytes"  # the pod's own folder
    assert read_int(pod_limit) == 128 * MI

    # a memory limit decrease under NotRequired: refused, nothing changes
    path.write_text(yaml.safe_dump(manifest(containerd.image, marker, uid, "500m", "96Mi")))
    pending = wait_for(lambda: cond(port, "PodResizePending") or None, 60.0, 0.2,
                       "PodResizePending")
    assert (pending["reason"], pending["message"]) == (
        "Infeasible", "memory limits cannot be decreased unless resizePolicy is "
                      "RestartContainer")
    assert read_int(limit) == 128 * MI and container_pid(marker) == pid
    path.unlink()
    wait_for(lambda: not (get_pods(port) or {"items": [1]}).get("items"), 60.0, 0.2,
             "the pod gone")
    assert handle.stop() == 0
