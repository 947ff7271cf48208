"""The pytest plugin (entry point ``pytest11: podvisor``, installed with podvisor): the
``podvisor_node`` fixture, a private agent per test (``Node``), always torn down.

Options: ``--podvisor-runtime ENDPOINT`` (default ``embedded``; a CRI socket such as
``unix:///run/containerd/containerd.sock``), ``--podvisor-kubeconfig FILE`` (join that API
server), ``--podvisor-keep`` (keep each node's temp dir: logs and state). A test module or
conftest can override the ``podvisor_node_options`` fixture to return its own ``NodeOptions``.

When a test using the fixture fails, its report gets a section "podvisor node" with the node's
processes, the faults in force and where its logs are. Teardown runs ``podvisorctl shutdown
--pods`` and kills by PID anything of the run still alive; it warns
(``PodvisorLeftProcesses``) when it had to.
"""

from __future__ import annotations

import warnings
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from podvisor.testing.node import Node, NodeOptions

__all__ = ["PodvisorLeftProcesses", "podvisor_node", "podvisor_node_options"]


class PodvisorLeftProcesses(UserWarning):
    """The node's teardown found processes of the run alive after shutdown (and killed them)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("podvisor", "podvisor node fixture")
    group.addoption("--podvisor-runtime", default="embedded", metavar="ENDPOINT",
                    help="the node's CRI runtime: embedded (default) or unix:///path.sock")
    group.addoption("--podvisor-kubeconfig", default=None, metavar="FILE",
                    help="a kubeconfig: the node joins that API server")
    group.addoption("--podvisor-keep", action="store_true",
                    help="keep each node's temp dir (logs, state) after the test")


@pytest.fixture
def podvisor_node_options(request: pytest.FixtureRequest) -> NodeOptions:
    """The options ``podvisor_node`` starts with (override this fixture to change them)."""
    config = request.config
    return NodeOptions(runtime=str(config.getoption("--podvisor-runtime")),
                       kubeconfig=config.getoption("--podvisor-kubeconfig"),
                       keep=bool(config.getoption("--podvisor-keep")))


@pytest.fixture
def podvisor_node(request: pytest.FixtureRequest,
                  podvisor_node_options: NodeOptions) -> Iterator[Node]:
    """A private podvisor agent on a temp rootDir, with its API (``podvisor.testing.Node``):
    ``apply``/``remove`` a manifest, ``wait_pod``, ``pods``, ``kill``/``stop``/``cont`` a
    subsystem, ``kill_container``, ``inject``/``clear``/``fault`` faults, ``check`` the
    invariants."""
    node = Node(podvisor_node_options)
    request.node.stash[_NODE] = node
    try:
        yield node
    finally:
        node.close()
        if node.left_behind:
            warnings.warn(PodvisorLeftProcesses(
                "podvisor node teardown killed processes left alive after shutdown: "
                + "; ".join(node.left_behind)), stacklevel=1)


_NODE = pytest.StashKey[Node]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]
                              ) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    node = item.stash.get(_NODE, None)
    if node is None or report.when != "call" or not report.failed:
        return
    try:
        lines = node.describe()
    except Exception as exc:  # a report must not fail for want of a description
        lines = [f"(the node could not be described: {exc})"]
    report.sections.append(("podvisor node", "\n".join(lines)))
