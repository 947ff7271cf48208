"""``Node``'s duplicate count against a real node (the `podvisor_node` fixture): a command exec'd
in a container (here its readiness probe, 2 s long) carries the container's marker beside the
container's own process, and is not a second copy of the container; a process that stays beside
it is (the count comes from the kernel's process table, as for a copy the runtime lost)."""

from __future__ import annotations

import os
import subprocess

from podvisor.testing import Node, wait_until
from podvisor.testing.node import MARKER

PROBED = """
apiVersion: v1
kind: Pod
metadata: {name: probed}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: host
    command: ["sleep", "100000"]
    readinessProbe:
      exec: {command: ["sleep", "2"]}
      periodSeconds: 4
      timeoutSeconds: 10
"""


def test_a_probes_command_is_no_duplicate_a_second_copy_is(podvisor_node: Node) -> None:
    node = podvisor_node
    node.apply(PROBED)
    node.wait_pod("probed", "Running")
    # the probe's `sleep 2` runs now beside the container's `sleep 100000`
    seen = wait_until(lambda: node.duplicates().get("probed/app"), 30, 0.02,
                      "the probe's command beside the container's")
    assert len(seen) == 2
    report = node.invariants(settle=30)
    assert report.ok, report.text()
    # a copy the runtime does not know of: the container's command with its marker, left alive
    copy = subprocess.Popen(["sleep", "100000"], env={
        **os.environ, MARKER: f"{node.token}/probed/app"})
    try:
        report = node.invariants(settle=3)
        # (the probe's command, if it runs at the last look, is counted beside the copy)
        assert report.counts["duplicate_containers"] >= 1, report.text()
        assert str(copy.pid) in " ".join(report.details), report.text()
    finally:
        copy.kill()
        copy.wait()
