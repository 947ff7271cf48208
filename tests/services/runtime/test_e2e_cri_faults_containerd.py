"""CRI faults on containerd (issue 28), through the agent's CRI proxy (``criProxy``: the
``runtime`` process proxies containerd on rootDir/run/cri.sock, the node's clients dial it):
latency and a status code on chosen methods reach the node's callers and no one else
(containerd itself answers as usual, the pod keeps its container), a hang gets the proxy found
hung and replaced, and once the fault ends the node runs on. Skipped with the reason when no
containerd is available (tests/support/containerd.py)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from podvisor.services.cri import CriError, new_runtime_client
from podvisor.testing import Node, NodeOptions, wait_until
from tests.support.containerd import ContainerdHandle, containerd_or_skip, remove_pod_cgroup
from tests.support.faultpods import restarts, wait_in_force

pytestmark = pytest.mark.containerd


@pytest.fixture(scope="module")
def containerd() -> ContainerdHandle:
    """Module scope: the session's containerd starts before the per-test leak snapshot."""
    return containerd_or_skip()


@pytest.fixture
def podvisor_node_options(containerd: ContainerdHandle) -> Iterator[NodeOptions]:
    cgroup_root = f"/podvisor-test-{secrets.token_hex(4)}"  # pods go under it
    yield NodeOptions(runtime=containerd.endpoint, config={"cgroupRoot": cgroup_root})
    remove_pod_cgroup(cgroup_root)


def _pod(image: str) -> str:
    return f"""apiVersion: v1
kind: Pod
metadata: {{name: web}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - {{name: app, image: "{image}", imagePullPolicy: IfNotPresent,
     command: ["sleep", "100000"]}}
"""


def _answers(cri: Any) -> str:
    try:
        return str(cri.version().runtime_name)
    except CriError:
        return ""


@pytest.mark.timeout(300)
def test_cri_faults_on_containerd_through_the_proxy(podvisor_node: Node,
                                                    containerd: ContainerdHandle) -> None:
    node = podvisor_node
    assert node.processes()["runtime"]["state"] == "RUNNING"  # the proxy
    node.apply(_pod(containerd.image))
    node.wait_pod("web", "Running", timeout=120)
    [pid] = node.container_pids("web")
    before = restarts(node)
    proxied = new_runtime_client(f"unix://{node.paths.cri_socket}", timeout=30.0)
    direct = new_runtime_client(containerd.endpoint, timeout=30.0)
    try:
        assert _answers(proxied) == _answers(direct) == "containerd"
        # the proxy takes a fault on the runtime process's next turn: wait for it each time
        with node.fault("cri", "runtime", action="latency", delay=2.0,
                        methods=["ListPodSandbox"]) as latency:
            wait_in_force(node, "runtime", latency)
            t0 = time.monotonic()
            proxied.list_pod_sandbox()
            assert time.monotonic() - t0 >= 2.0  # injected at the proxy
            direct.list_pod_sandbox()  # containerd itself is not slowed (no bound: no timing)
        wait_in_force(node, "runtime", latency, present=False)
        with node.fault("cri", "runtime", action="error", code="UNAVAILABLE",
                        methods=["ListContainers"]) as error:
            wait_in_force(node, "runtime", error)
            with pytest.raises(CriError) as err:
                proxied.list_containers()
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
            assert "injected fault" in err.value.message
            assert direct.list_containers()  # containerd answers
            assert proxied.list_pod_sandbox()  # and the other methods through the proxy
        wait_in_force(node, "runtime", error, present=False)
        assert proxied.list_containers()  # cleared
        assert node.container_pids("web") == [pid] and restarts(node) == before
        runtime = node.processes()["runtime"]
        node.inject("cri", "runtime", action="hang", duration=8.0)
        row = wait_until(lambda: (r := node.processes().get("runtime")) and r["restarts"] >
                         runtime["restarts"] and r, 60, 0.1, "the hung proxy replaced")
        assert row["lastExit"]["reason"].startswith("no heartbeat"), row
        wait_until(lambda: not node.faults(), 30, 0.1, "the hang to expire")
        node.wait_up(60)
        assert wait_until(lambda: _answers(proxied), 60, 0.2, "the proxy answering again")
    finally:
        proxied.close()
        direct.close()
    assert node.container_pids("web") == [pid]  # containerd's containers never noticed
    node.kill_container("web")
    node.wait_pod("web", "Running", restarts=1, timeout=120)  # and the node runs on
    node.check()
