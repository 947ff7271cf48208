"""kill and stop faults against a real node (the `podvisor_node` fixture, issue 28): a killed
subsystem is restarted; a stop shorter than the heartbeat timeout just resumes, a longer one gets
the process replaced; a container killed is restarted."""

from __future__ import annotations

from podvisor.testing import Node, wait_until
from tests.support.faultpods import running


def test_kill_and_stop_a_subsystem(podvisor_node: Node) -> None:
    node = podvisor_node
    [pid] = running(node)
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
