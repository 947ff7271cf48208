"""`resource` faults (issue 28): CPU or memory pressure from a stress child in the cgroups of a
subsystem or of a pod's container; ended, the child is gone and nothing else changed."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from podvisor.testing import Node, wait_until

POD = """apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: host
    command: ["sleep", "100000"]
    resources:
      limits: {memory: 256Mi, cpu: "1"}
"""


def _stress() -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "podvisor.supervisor.stress" in cmd:
            out.append(proc)
    return out


def _cgroup(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


def test_cpu_pressure_on_a_subsystem(podvisor_node: Node) -> None:
    node = podvisor_node
    before = {n: (r["pid"], r["restarts"]) for n, r in node.processes().items()}
    with node.fault("resource", "pleg", action="cpu", amount=2) as fault:
        assert fault.spec.describe() == "resource pleg: cpu 2 busy"
        procs = wait_until(lambda: len(_stress()) == 2 and _stress(), 10, 0.05,
                           "the stress child and its second worker")
        assert {_cgroup(p.pid) for p in procs} == {_cgroup(before["pleg"][0])}
        wait_until(lambda: all(p.cpu_percent(0.2) > 20 for p in procs), 10, 0.1, "busy")
    wait_until(lambda: not _stress(), 10, 0.05, "the stress child gone")
    assert {n: (r["pid"], r["restarts"]) for n, r in node.processes().items()} == before


def _memory_charge(pid: int) -> int:
    """Bytes charged to the memory cgroup of ``pid`` (v2 memory.current, v1 usage)."""
    for line in _cgroup(pid).splitlines():
        _, ctl, path = line.split(":", 2)
        if ctl == "" and Path(f"/sys/fs/cgroup{path}/memory.current").exists():
            return int(Path(f"/sys/fs/cgroup{path}/memory.current").read_text())
        if "memory" in ctl.split(","):
            return int(Path(f"/sys/fs/cgroup/memory{path}/memory.usage_in_bytes").read_text())
    raise AssertionError(f"no memory cgroup for {pid}")


@pytest.mark.skipif(os.geteuid() != 0, reason="pod cgroups need root")
def test_memory_pressure_in_a_pods_cgroup(podvisor_node: Node) -> None:
    node = podvisor_node
    node.apply(POD)
    node.wait_pod("web", "Running")
    [pid] = node.container_pids("web")
    if "/pod" not in _cgroup(pid):
        pytest.skip("the runtime ran the pod without cgroups here")
    idle = _memory_charge(pid)
    with node.fault("resource", "pod/web", action="memory", amount=64):
        [child] = wait_until(lambda: _stress(), 10, 0.05, "the stress child")
        assert _cgroup(child.pid) == _cgroup(pid)  # in the container's cgroups
        wait_until(lambda: _memory_charge(pid) >= idle + 60 * 2**20, 20, 0.1,
                   "64 MiB charged to the pod's container")
    wait_until(lambda: not _stress(), 10, 0.05, "the stress child gone")
    wait_until(lambda: _memory_charge(pid) < idle + 32 * 2**20, 20, 0.1, "the charge gone")
    assert node.container_pids("web") == [pid] and node.restarts("web") == 0
    bad = node.agent.ctl("fault", "inject", "resource", "pod/nosuch", "--action", "cpu")
    assert bad.returncode == 1 and "no cgroup of pod 'nosuch'" in bad.stderr
    node.check()
