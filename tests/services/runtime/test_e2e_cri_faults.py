"""CRI faults in the embedded runtime against a real node (the `podvisor_node` fixture, issue
28): latency and a status code on chosen methods, and only those; a hang gets the runtime
replaced (its liveness probe hangs too) and expires; clearing restores normal answers."""

from __future__ import annotations

import time
from typing import Any

import pytest

from podvisor.services.cri import CriError, new_runtime_client
from podvisor.testing import Node, wait_until
from tests.support.faultpods import restarts, running, wait_in_force


def cri_client(node: Node) -> Any:
    return new_runtime_client(f"unix://{node.paths.cri_socket}", timeout=30.0)


def _answers(cri: Any) -> str:
    try:
        return str(cri.version().runtime_name)
    except CriError:
        return ""


def test_cri_latency_and_error_on_chosen_methods(podvisor_node: Node) -> None:
    node = podvisor_node
    [pid] = running(node)
    before = restarts(node)
    cri = cri_client(node)
    try:
        # the servicer takes a fault on the runtime process's next turn: wait for it each time
        with node.fault("cri", "runtime", action="latency", delay=2.0,
                        methods=["ListPodSandbox"]) as latency:
            wait_in_force(node, "runtime", latency)
            t0 = time.monotonic()
            cri.list_pod_sandbox()
            assert time.monotonic() - t0 >= 2.0  # the latency is injected, not measured
            cri.version()  # another method is not slowed (no bound asserted: no timing)
        wait_in_force(node, "runtime", latency, present=False)
        with node.fault("cri", "runtime", action="error", code="RESOURCE_EXHAUSTED",
                        methods=["ListContainers"]) as error:
            wait_in_force(node, "runtime", error)
            with pytest.raises(CriError) as err:
                cri.list_containers()
            assert "RESOURCE_EXHAUSTED" in str(err.value) and "injected fault" in str(err.value)
            assert cri.list_pod_sandbox()  # the others answer
        wait_in_force(node, "runtime", error, present=False)
        assert cri.list_containers()  # cleared: answers again
    finally:
        cri.close()
    assert node.container_pids("web") == [pid]  # the container never noticed
    assert restarts(node) == before  # nor did the runtime's own liveness
    node.check()


def test_cri_hang_gets_the_runtime_replaced_and_expires(podvisor_node: Node) -> None:
    node = podvisor_node
    [pid] = running(node)
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
    cri = cri_client(node)
    try:
        # RUNNING is the supervisor's word; the socket may come a moment later (a runtime
        # hung anew by the fault still in force when it started is replaced once more)
        assert wait_until(lambda: _answers(cri), 60, 0.2, "the runtime answering again")
    finally:
        cri.close()
    assert node.container_pids("web") == [pid]  # containers outlive a runtime replaced
    node.check()
