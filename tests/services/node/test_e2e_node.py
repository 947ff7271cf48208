"""The ``node`` process end to end against the stand-in API server (embedded runtime): the Node
is registered Ready with the KUBELET.md fields, the Lease is renewed, an unchanged status is
not PATCHed again before nodeStatusReportFrequency, kill -9 of ``node`` re-registers (409 ->
reconcile) and the Lease never lapses."""

from __future__ import annotations

import datetime as dt
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kubeapi import ApiError, KubeApi

NODE = "e2e-node"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi")
    server.start()
    yield server
    server.stop()


def renew_time(api: KubeApi) -> float:
    try:
        lease = api.store.get("leases", "kube-node-lease", NODE)
    except ApiError:
        return 0.0
    text = lease["spec"]["renewTime"]
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=dt.UTC).timestamp()


def ready(api: KubeApi) -> dict[str, Any] | None:
    try:
        node = api.store.get("nodes", "", NODE)
    except ApiError:
        return None
    conds = {c["type"]: c for c in node.get("status", {}).get("conditions", [])}
    return node if conds.get("Ready", {}).get("status") == "True" else None


def test_node_registered_ready_lease_renewed_and_kill9(api: KubeApi, agent: Any,
                                                       wait_for: Callable[..., Any],
                                                       tmp_path: Path) -> None:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", user=f"system:node:{NODE}",
                                groups=("system:nodes",))
    handle = agent(config={
        "nodeName": NODE, "kubeconfig": str(kubeconfig), "port": 10250,
        "nodeLeaseRenewInterval": "1s", "nodeStatusUpdateFrequency": "500ms",
        "nodeStatusReportFrequency": "1h", "nodeLeaseDurationSeconds": 40,
        "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}})
    node = wait_for(lambda: ready(api), timeout=15, message="Node Ready within 15 s")
    status = node["status"]
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == NODE
    assert node["metadata"]["labels"]["kubernetes.io/os"] == "linux"
    assert "kubernetes.io/arch" in node["metadata"]["labels"]
    info = status["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("podvisor-embedded://")
    assert [h["name"] for h in status["runtimeHandlers"]] == ["", "podvisor"]
    assert info["operatingSystem"] == "linux" and info["kubeletVersion"]
    assert info["bootID"] and info["kernelVersion"]
    assert status["capacity"]["pods"] == "110" and status["allocatable"]["cpu"]
    assert {a["type"] for a in status["addresses"]} == {"InternalIP", "Hostname"}
    assert status["daemonEndpoints"]["kubeletEndpoint"]["Port"] == 10250
    assert {c["type"] for c in status["conditions"]} == {
        "Ready", "MemoryPressure", "DiskPressure", "PIDPressure"}
    lease = api.store.get("leases", "kube-node-lease", NODE)
    assert lease["spec"]["holderIdentity"] == NODE
    assert lease["spec"]["leaseDurationSeconds"] == 40
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    first = renew_time(api)
    wait_for(lambda: renew_time(api) > first, timeout=10, message="the Lease renewed")
    # unchanged status: computed every 500 ms but PATCHed only once (report frequency 1 h)
    patches = api.count("PATCH", f"/nodes/{NODE}/status")
    wait_for(lambda: api.count("PUT", f"/leases/{NODE}") >= 3, timeout=15)
    assert api.count("PATCH", f"/nodes/{NODE}/status") == patches
    # kill -9: back, re-registered by reconcile (409), the Lease renewed long before 40 s
    pid = handle.wait_state("node", "RUNNING")["pid"]
    before = renew_time(api)
    os.kill(pid, signal.SIGKILL)
    handle.wait_state("node", "RUNNING", where=lambda r: r["pid"] != pid)
    wait_for(lambda: renew_time(api) > before, timeout=15, message="the Lease renewed again")
    assert renew_time(api) - before < 40
    assert api.count("POST", "/api/v1/nodes", code=409) >= 1
    assert api.count("PATCH", f"/api/v1/nodes/{NODE}", code=200) >= 1
