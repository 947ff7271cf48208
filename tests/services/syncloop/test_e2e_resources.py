"""End to end: a pod's resources are enforced, on the embedded runtime and on containerd.

The real agent (`podvisor run`) with a per-test `cgroupRoot`: a container limited to 50Mi that
touches 200 MB is OOM-killed; with restartPolicy Always it restarts with back-off and `/pods`
shows `lastState.terminated` reason OOMKilled, exit code 137, as the kubelet does. On the
embedded runtime, a field it cannot honour (a hugepages limit: no hugetlb support) is refused at
CreateContainer: `/pods` shows the container waiting with CreateContainerError and the reason,
and `podvisorctl events` a Failed event with the same text. containerd tests are skipped with
the reason when no containerd is available.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.containerd import containerd_or_skip
from tests.support.lifecycle import agent_config, free_port, get_pods

pytestmark = pytest.mark.skipif(not Path("/sys/fs/cgroup/memory").is_dir(),
                                reason="no cgroup v1 memory hierarchy on this host")

ALLOC = "dd if=/dev/zero of=/dev/null bs=200M count=1"


@pytest.fixture(params=["embedded", pytest.param("containerd", marks=pytest.mark.containerd)])
def runtime(request: pytest.FixtureRequest) -> dict[str, str]:
    """Agent config keys and the image for the runtime under test."""
    if request.param == "embedded":
        return {"image": "host"}
    handle = containerd_or_skip()
    return {"image": handle.image, "runtimeEndpoint": handle.endpoint}


def manifest(name: str, image: str, command: str, resources: dict[str, Any]) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"restartPolicy": "Always", "terminationGracePeriodSeconds": 1,
                 "hostNetwork": True,
                 "containers": [{"name": "c", "image": image, "imagePullPolicy": "IfNotPresent",
                                 "command": ["sh", "-c", command], "resources": resources}]}})


def container_status(port: int, name: str) -> dict[str, Any] | None:
    body = get_pods(port)
    for pod in (body or {}).get("items", []):
        if pod["metadata"]["name"].startswith(f"{name}-"):
            statuses = pod.get("status", {}).get("containerStatuses", [])
            return statuses[0] if statuses else None
    return None


@pytest.mark.timeout(240)
def test_oom_killed_pod_restarts_with_back_off(cgroup_root: str, agent: Any, manifests: Path,
                                               runtime: dict[str, str], wait_for: Any) -> None:
    image = runtime.pop("image")
    (manifests / "oom.yaml").write_text(manifest("oom", image, ALLOC,
                                                 {"limits": {"memory": "50Mi"}}))
    port = free_port()
    agent(config=agent_config(manifests, port, cgroupRoot=cgroup_root,
                              syncloop={"crashLoopBackOffInitial": "1s",
                                        "crashLoopBackOffMax": "4s"}, **runtime))
    seen: set[str] = set()

    def restarted_after_oom() -> dict[str, Any] | None:
        st = container_status(port, "oom")
        if st is None:
            return None
        seen.update(v.get("reason", "") for v in st.get("state", {}).values())
        last = st.get("lastState", {}).get("terminated", {})
        done = last.get("reason") == "OOMKilled" and st.get("restartCount", 0) >= 2
        return st if done and "CrashLoopBackOff" in seen else None

    st = wait_for(restarted_after_oom, 180.0, 0.1, "restarts after OOM kills with back-off")
    last = st["lastState"]["terminated"]
    assert (last["reason"], last["exitCode"]) == ("OOMKilled", 137), st

    uid = next(p["metadata"]["uid"] for p in (get_pods(port) or {}).get("items", []))
    pod_memory = Path("/sys/fs/cgroup/memory") / cgroup_root.strip("/") / f"pod{uid}"
    (manifests / "oom.yaml").unlink()
    wait_for(lambda: not pod_memory.exists(), 60.0, 0.2,
             f"{pod_memory} removed with the pod (containers' folders by the runtime, the "
             "pod's by the sync loop)")


@pytest.mark.timeout(120)
def test_refused_resource_shows_in_pods_and_events(cgroup_root: str, agent: Any,
                                                   manifests: Path, wait_for: Any) -> None:
    (manifests / "huge.yaml").write_text(manifest(
        "huge", "host", "sleep 1000", {"limits": {"hugepages-2Mi": "4Mi", "memory": "50Mi"}}))
    port = free_port()
    handle = agent(config=agent_config(manifests, port, cgroupRoot=cgroup_root))

    def waiting() -> dict[str, Any] | None:
        st = container_status(port, "huge")
        w = (st or {}).get("state", {}).get("waiting", {})
        return w if w.get("reason") == "CreateContainerError" else None

    w = wait_for(waiting, 60.0, 0.1, "the container waiting with CreateContainerError")
    assert "hugepage limits (2MB) are not supported by the embedded runtime" in w["message"]

    def failed_event() -> bool:
        out = handle.ctl("events", "--json")
        return any(e.get("reason") == "Failed" and "hugepage limits" in e.get("message", "")
                   for e in yaml.safe_load(out.stdout or "{}").get("items", []))

    wait_for(failed_event, 30.0, 0.2, "a Failed event naming the refusal")


@pytest.mark.timeout(120)
def test_a_guaranteed_pods_cgroup_has_the_pods_limits(cgroup_root: str, agent: Any,
                                                      manifests: Path, runtime: dict[str, str],
                                                      wait_for: Any) -> None:
    """The kubelet's pod-level limits on ``<cgroupRoot>/pod<uid>`` (made by the sync loop
    before the sandbox): memory = the sum of the containers' limits, CPU quota = the sum of
    the CPU limits, shares from the summed requests, pids.max from ``podPidsLimit``; the
    containers' own cgroups sit under it."""
    image = runtime.pop("image")
    limits = {"limits": {"cpu": "100m", "memory": "40Mi"}}
    doc = yaml.safe_load(manifest("sum", image, "sleep 1000", limits))
    second = dict(doc["spec"]["containers"][0], name="d")
    doc["spec"]["containers"].append(second)
    (manifests / "sum.yaml").write_text(yaml.safe_dump(doc))
    port = free_port()
    agent(config=agent_config(manifests, port, cgroupRoot=cgroup_root, podPidsLimit=64,
                              **runtime))

    def running() -> str | None:
        for pod in (get_pods(port) or {}).get("items", []):
            statuses = pod.get("status", {}).get("containerStatuses", [])
            if len(statuses) == 2 and all("running" in s.get("state", {}) for s in statuses):
                return str(pod["metadata"]["uid"])
        return None

    uid = wait_for(running, 60.0, 0.1, "both containers running")
    pod = f"{cgroup_root.strip('/')}/pod{uid}"
    cg = Path("/sys/fs/cgroup")
    assert (cg / "memory" / pod / "memory.limit_in_bytes").read_text().strip() == \
        str(80 << 20)
    assert (cg / "cpu" / pod / "cpu.cfs_quota_us").read_text().strip() == "20000"
    assert (cg / "cpu" / pod / "cpu.cfs_period_us").read_text().strip() == "100000"
    assert (cg / "cpu" / pod / "cpu.shares").read_text().strip() == "204"
    assert (cg / "pids" / pod / "pids.max").read_text().strip() == "64"
    children = [d for d in (cg / "memory" / pod).iterdir() if d.is_dir()]
    assert children, "the containers' memory cgroups are under the pod's"
