"""A small pod and the readings the fault tests of several folders take on a `podvisor_node`
(issue 28): tests/ipc (bus faults), tests/services/runtime (cri faults), tests/supervisor (kill,
stop)."""

from __future__ import annotations

from podvisor.testing import Node

POD = """apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - {name: app, image: host, command: ["sleep", "100000"]}
"""


def restarts(node: Node) -> dict[str, int]:
    """Each subsystem's restart count."""
    return {name: row["restarts"] for name, row in node.processes().items()}


def running(node: Node) -> list[int]:
    """Apply `POD`, wait for it Running; its containers' PIDs."""
    node.apply(POD)
    node.wait_pod("web", "Running")
    return node.container_pids("web")
