"""podvisor.testing: test your workloads against node faults (issue 28).

Installed with podvisor as a pytest plugin: a test that asks for the ``podvisor_node`` fixture
gets a private agent (``Node``) on a temp rootDir, torn down after it. Without pytest,
``Node(NodeOptions())`` and ``node.close()`` do the same. See the README, "Testing your
workloads against node faults", and docs/examples/test_workload.py.
"""

from podvisor.ipc.faults import ActiveFault, FaultSpec
from podvisor.testing.agent import AgentProcess, wait_until
from podvisor.testing.invariants import INVARIANTS, InvariantError, InvariantReport
from podvisor.testing.node import MARKER, Node, NodeOptions

__all__ = [
    "INVARIANTS",
    "MARKER",
    "ActiveFault",
    "AgentProcess",
    "FaultSpec",
    "InvariantError",
    "InvariantReport",
    "Node",
    "NodeOptions",
    "wait_until",
]
