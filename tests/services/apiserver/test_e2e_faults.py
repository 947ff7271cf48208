"""`api` faults between a real node and the stand-in API server (issue 28): an outage (every
request answered 503, every watch cut) never restarts a pod and nothing reaches the server
while it lasts; a watch disconnect resumes from its resourceVersion without a relist; a 410
Gone makes source-api relist; latency slows the node's writes and changes nothing else."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podvisor.testing import Node, NodeOptions, wait_until
from tests.support.kubeapi import KubeApi

NODE = "testnode"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def podvisor_node_options(api: KubeApi, tmp_path: Path) -> NodeOptions:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", user=f"system:node:{NODE}",
                                groups=("system:nodes",))
    return NodeOptions(kubeconfig=str(kubeconfig), node_name=NODE,
                       config={"apiWatchTimeout": "5s"})


def _create(api: KubeApi, node: Node, name: str) -> None:
    api.store.create("pods", "default", node.marked({"metadata": {"name": name}, "spec": {
        "nodeName": NODE, "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 2, "restartPolicy": "Always",
        "containers": [{"name": "c", "image": "host", "command": ["sleep", "3600"]}]}}))


def _api_phase(api: KubeApi, name: str) -> str:
    try:
        return str((api.store.get("pods", "default", name).get("status") or {}).get("phase"))
    except Exception:
        return ""


def _pod_requests(api: KubeApi, since: float, until: float = float("inf")) -> list[Any]:
    return sorted((r for r in list(api.requests)
                   if r.path == "/api/v1/pods" and since < r.started < until),
                  key=lambda r: r.started)


def _is_watch(request: Any) -> bool:
    return urllib.parse.parse_qs(request.query).get("watch") == ["1"]


def test_an_api_outage_never_restarts_a_pod(api: KubeApi, podvisor_node: Node) -> None:
    node = podvisor_node
    _create(api, node, "web")
    node.wait_pod("web", "Running")
    wait_until(lambda: _api_phase(api, "web") == "Running", 60, 0.1, "web's status in the API")
    [pid] = node.container_pids("web")
    before = {n: r["restarts"] for n, r in node.processes().items()}
    t0 = time.monotonic()
    errors = node.inject("api", "apiserver", action="error", status=503, duration=8)
    cuts = node.inject("api", "apiserver", action="disconnect", duration=8)
    _create(api, node, "late")  # the node cannot hear of it until the outage ends
    wait_until(lambda: not node.faults(), 60, 0.1, "the outage to end")
    t1 = time.monotonic()
    node.wait_pod("late", "Running", timeout=60)
    wait_until(lambda: _api_phase(api, "late") == "Running", 60, 0.1, "late's status written")
    assert node.container_pids("web") == [pid] and node.restarts("web") == 0
    assert {n: r["restarts"] for n, r in node.processes().items()} == before
    # nothing of the node reached the API server while it was out (1 s of slack each side)
    reached = [r for r in list(api.requests)
               if t0 + 1.0 < r.started < t1 - 1.0 and r.user == f"system:node:{NODE}"]
    assert reached == [], reached
    ended = {e["involvedObject"]["name"] for e in node.events("FaultCleared")}
    assert {errors.id, cuts.id} <= ended
    node.check()


def test_a_watch_disconnect_resumes_without_a_relist(api: KubeApi,
                                                      podvisor_node: Node) -> None:
    node = podvisor_node
    _create(api, node, "web")
    node.wait_pod("web", "Running")
    t0 = time.monotonic()
    node.inject("api", "source-api", action="disconnect", duration=2)
    wait_until(lambda: not node.faults(), 30, 0.1, "the disconnect to end")
    _create(api, node, "after")
    node.wait_pod("after", "Running", timeout=60)
    lists = [r for r in _pod_requests(api, t0) if not _is_watch(r)]
    assert lists == [], [(r.query, r.code) for r in lists]  # watched on from its version
    cut = [r for r in list(api.requests) if r.path == "/api/v1/pods" and _is_watch(r)
           and r.started < t0 < r.at]
    assert cut, "the watch open at the fault's start was cut"
    node.check()


def test_a_410_gone_makes_source_api_relist(api: KubeApi, podvisor_node: Node) -> None:
    node = podvisor_node
    _create(api, node, "web")
    node.wait_pod("web", "Running")
    [pid] = node.container_pids("web")
    t0 = time.monotonic()
    node.inject("api", "source-api", action="gone", duration=10)
    lists = wait_until(lambda: [r for r in _pod_requests(api, t0) if not _is_watch(r)], 30,
                       0.1, "source-api's relist after the 410")
    assert lists[0].code == 200
    node.clear()
    _create(api, node, "after")
    node.wait_pod("after", "Running", timeout=60)
    assert node.container_pids("web") == [pid] and node.restarts("web") == 0
    node.check()


def test_api_latency_slows_the_writes_and_nothing_else(api: KubeApi,
                                                        podvisor_node: Node) -> None:
    node = podvisor_node
    with node.fault("api", "status-api", action="latency", delay=1.5):
        _create(api, node, "web")
        node.wait_pod("web", "Running")
        wait_until(lambda: _api_phase(api, "web") == "Running", 60, 0.1, "web's status")
    node.check()


def test_an_api_fault_reaches_the_sync_loops_own_clients(api: KubeApi,
                                                         podvisor_node: Node) -> None:
    """The sync loop reads a pod's Secrets and ConfigMaps (and the RuntimeClasses) with its own
    API clients: an api fault aimed at it answers them too. The pod waits on its Secret and no
    request for it reaches the server while the fault lasts; once cleared, the pod runs."""
    node = podvisor_node
    api.store.create("secrets", "default", {"metadata": {"name": "creds"},
                                            "data": {"user": "YWRh"}})  # "ada"
    with node.fault("api", "syncloop", action="error", status=503):
        t0 = time.monotonic()
        api.store.create("pods", "default", node.marked({"metadata": {"name": "uses"}, "spec": {
            "nodeName": NODE, "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "c", "image": "host", "command": ["sleep", "3600"],
                            "env": [{"name": "USER", "valueFrom": {"secretKeyRef": {
                                "name": "creds", "key": "user"}}}]}]}}))

        def waiting() -> dict[str, Any]:
            pod = node.pod("uses") or {}
            states = [c.get("state", {}).get("waiting", {}) for c in
                      pod.get("status", {}).get("containerStatuses", [])]
            return next((w for w in states if w), {})

        waited = wait_until(lambda: (w := waiting()).get("reason") ==
                            "CreateContainerConfigError" and w, 90, 0.1,
                            "the pod waiting on its Secret")
        assert "503" in waited.get("message", ""), waited
        t1 = time.monotonic()
    reached = [r for r in list(api.requests) if "/secrets" in r.path and t0 < r.started < t1]
    assert reached == [], reached
    node.wait_pod("uses", "Running", timeout=90)
    node.check()
