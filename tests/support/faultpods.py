"""A small pod and the readings the fault tests of several folders take on a `podvisor_node`
(issue 28): tests/ipc (bus faults), tests/services/runtime (cri faults), tests/supervisor (kill,
stop); ``wait_in_force``: a fault the supervisor took (or dropped) is applied by the process
it aims at."""

from __future__ import annotations

import json

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
    """The fault ids ``process`` last said it applied (its ``faults.in_force`` log line,
    common/service.py); None before its first such line."""
    path = node.paths.logs_dir / f"{process}.log"
    if not path.exists():
        return None
    last = None
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("event") == "faults.in_force":
            last = [str(f) for f in doc.get("faults") or []]
    return last


def wait_in_force(node: Node, process: str, fault: ActiveFault, present: bool = True) -> None:
    """Wait until ``process`` applied ``fault`` (``present``) or dropped it: ``fault-inject``
    and ``fault-clear`` answer once the supervisor wrote the faults file, and the process
    reads it on its own loop's next turn (a call made in between meets the old faults)."""
    wait_until(lambda: (ids := in_force(node, process)) is not None and
               (fault.id in ids) == present, 30, 0.05,
               f"{process} {'applying' if present else 'dropping'} {fault.id}")
