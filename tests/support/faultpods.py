"""A small pod and the readings the fault tests of several folders take on a `podvisor_node`
(issue 28): tests/ipc (bus faults), tests/services/runtime (cri faults), tests/supervisor (kill,
stop); ``wait_in_force``: a fault the supervisor took (or dropped) is applied by the process
it aims at."""

from __future__ import annotations

from podvisor.ipc.faults import ActiveFault
from podvisor.testing import Node, wait_until

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


def in_force(node: Node, process: str) -> list[str] | None:
    """The fault ids ``process`` last said it applied (``Node.applied_faults``)."""
    return node.applied_faults(process)


def wait_in_force(node: Node, process: str, fault: ActiveFault, present: bool = True) -> None:
    """Wait until ``process`` applied ``fault`` (``present``) or dropped it (``Node.inject``
    and ``Node.clear`` already wait so; for faults sent around them)."""
    wait_until(lambda: (ids := in_force(node, process)) is not None and
               (fault.id in ids) == present, 30, 0.05,
               f"{process} {'applying' if present else 'dropping'} {fault.id}")

