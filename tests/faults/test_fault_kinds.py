"""Each fault kind against a real node (the `podvisor_node` fixture, issue 28): inject it, see
its effect and no other (the pod keeps its container, nothing else restarts), clear it (or let
it expire) and see normal operation come back."""

from __future__ import annotations

import time
from typing import Any

import pytest

from podvisor.services.cri import CriError, new_runtime_client
from podvisor.testing import Node, wait_until

POD = """apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - {name: app, image: host, command: ["sleep", "100000"]}
"""


def _restarts(node: Node) -> dict[str, int]:
    return {name: row["restarts"] for name, row in node.processes().items()}


def _running(node: Node) -> list[int]:
    node.apply(POD)
    node.wait_pod("web", "Running")
    return node.container_pids("web")


def test_bus_partition_of_pleg_hides_a_restart_until_cleared(podvisor_node: Node) -> None:
    node = podvisor_node
    [old] = _running(node)
    before = _restarts(node)
    with node.fault("bus", "pleg", action="drop", direction="send"):
        node.kill_container("web")
        # the sync loop hears of the death from the runtime itself and restarts the container
        wait_until(lambda: (p := node.container_pids("web")) and p != [old], 30, 0.05,
                   "a new container process")
        # but PLEG's map is cut off: the status (computed from it) never learns of the restart
        with pytest.raises(AssertionError):
            node.wait_pod("web", "Running", restarts=1, timeout=4)
    # healed: the replicas see PLEG's sequence jump, take a snapshot, and /pods catches up
    node.wait_pod("web", "Running", restarts=1, timeout=30)
    assert _restarts(node) == before  # no subsystem was restarted by the partition
    node.check()


def test_bus_duplicates_and_delays_change_nothing_but_timing(podvisor_node: Node) -> None:
    node = podvisor_node
    _running(node)
    before = _restarts(node)
    with node.fault("bus", "pleg", action="duplicate", direction="send"), \
            node.fault("bus", "status", action="delay", delay=0.3, direction="recv"):
        node.kill_container("web")
        node.wait_pod("web", "Running", restarts=1, timeout=30)
        node.check()  # each update twice, each status 0.3 s late: still one container
    assert _restarts(node) == before
    node.kill_container("web")
    node.wait_pod("web", "Running", restarts=2, timeout=30)
    node.check()


def _cri(node: Node) -> Any:
    return new_runtime_client(f"unix://{node.paths.cri_socket}", timeout=30.0)


def test_cri_latency_and_error_on_chosen_methods(podvisor_node: Node) -> None:
    node = podvisor_node
    [pid] = _running(node)
    before = _restarts(node)
    cri = _cri(node)
    try:
        with node.fault("cri", "runtime", action="latency", delay=2.0,
                        methods=["ListPodSandbox"]):
            t0 = time.monotonic()
            cri.list_pod_sandbox()
            assert time.monotonic() - t0 >= 2.0  # the latency is injected, not measured
            cri.version()  # another method is not slowed (no bound asserted: no timing)
        with node.fault("cri", "runtime", action="error", code="RESOURCE_EXHAUSTED",
                        methods=["ListContainers"]):
            with pytest.raises(CriError) as err:
                cri.list_containers()
            assert "RESOURCE_EXHAUSTED" in str(err.value) and "injected fault" in str(err.value)
            assert cri.list_pod_sandbox()  # the others answer
        assert cri.list_containers()  # cleared: answers again
    finally:
        cri.close()
    assert node.container_pids("web") == [pid]  # the container never noticed
    assert _restarts(node) == before  # nor did the runtime's own liveness
    node.check()


def test_cri_hang_gets_the_runtime_replaced_and_expires(podvisor_node: Node) -> None:
    node = podvisor_node
    [pid] = _running(node)
    runtime = node.processes()["runtime"]
    fault = node.inject("cri", "runtime", action="hang", duration=8.0)
    # the runtime's probe hangs too: no heartbeat, so the supervisor replaces it
    row = wait_until(lambda: (r := node.processes().get("runtime")) and r["restarts"] >
                     runtime["restarts"] and r, 60, 0.1, "the hung runtime replaced")
    assert row["lastExit"]["reason"].startswith("no heartbeat"), row  # judged hung
    wait_until(lambda: not node.faults(), 30, 0.1, "the hang to expire")
    [ended] = [e["message"] for e in node.events("FaultCleared")
               if e["involvedObject"]["name"] == fault.id]
    assert ended.startswith(f"{fault.id} cri runtime: hang on every call: expired")
    node.wait_up(60)
    cri = _cri(node)
    try:
        assert cri.version().runtime_name
    finally:
        cri.close()
    assert node.container_pids("web") == [pid]  # containers outlive a runtime replaced
    node.check()


def test_kill_and_stop_a_subsystem(podvisor_node: Node) -> None:
    node = podvisor_node
    [pid] = _running(node)
    old = node.processes()
    node.kill("syncloop")
    node.agent.wait_state("syncloop", "RUNNING", 30,
                          where=lambda r: r["pid"] != old["syncloop"]["pid"])
    node.stop("pleg", duration=0.5)  # shorter than its heartbeat timeout: it just resumes
    wait_until(lambda: not node.faults(), 30, 0.05, "the stop to end")
    assert node.processes()["pleg"]["pid"] == old["pleg"]["pid"]
    node.stop("prober")  # held past the heartbeat timeout (3 s): replaced
    node.agent.wait_state("prober", "RUNNING", 30,
                          where=lambda r: r["pid"] != old["prober"]["pid"])
    node.cont("prober")
    assert not node.faults()
    node.kill_container("web")
    node.wait_pod("web", "Running", restarts=1)
    assert node.container_pids("web") != [pid]
    node.check()
