"""Bus faults against a real node (the `podvisor_node` fixture, issue 28): a partition of PLEG
(its sends dropped) hides a restart until cleared; duplicates and delays change nothing but
timing. The gate itself: tests/ipc/test_busgate.py."""

from __future__ import annotations

import pytest

from podvisor.testing import Node, wait_until
from tests.support.faultpods import restarts, running


def test_bus_partition_of_pleg_hides_a_restart_until_cleared(podvisor_node: Node) -> None:
    node = podvisor_node
    [old] = running(node)
    before = restarts(node)
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
    assert restarts(node) == before  # no subsystem was restarted by the partition
    node.check()


def test_bus_duplicates_and_delays_change_nothing_but_timing(podvisor_node: Node) -> None:
    node = podvisor_node
    running(node)
    before = restarts(node)
    with node.fault("bus", "pleg", action="duplicate", direction="send"), \
            node.fault("bus", "status", action="delay", delay=0.3, direction="recv"):
        node.kill_container("web")
        node.wait_pod("web", "Running", restarts=1, timeout=30)
        node.check()  # each update twice, each status 0.3 s late: still one container
    assert restarts(node) == before
    node.kill_container("web")
    node.wait_pod("web", "Running", restarts=2, timeout=30)
    node.check()
