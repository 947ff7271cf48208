"""kill -9 of the whole agent and of ``status`` while joined to the stand-in API server: no pod
restarted (same container ID), no status regressed in the API, the Lease renewed by the next
agent, whose source-api resumes the watch without a relist; and (slow) the API server away for
60 s: pods keep running and the statuses made meanwhile reach the API when it is back."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import process_gone
from tests.support.kubeapi import ApiError, KubeApi
from tests.support.lifecycle import free_port, get_pods

NODE = "e2e-dur"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    server.start()
    yield server
    server.stop()


def api_pod(name: str, command: str = "sleep 3600", policy: str = "Always") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "nodeName": NODE, "automountServiceAccountToken": False, "restartPolicy": policy,
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": "host", "command": ["sh", "-c", command]}]}}


def container(api: KubeApi, name: str) -> tuple[str, int, str]:
    """(container ID, restartCount, state) of the pod's container in the API ('' if none)."""
    try:
        st = api.store.get("pods", "default", name).get("status", {})
    except ApiError:
        return "", -1, ""
    cs = (st.get("containerStatuses") or [{}])[0]
    return (str(cs.get("containerID", "")), int(cs.get("restartCount", -1)),
            next(iter(cs.get("state") or {}), ""))


def config(kubeconfig: Path, root: Path) -> dict[str, Any]:
    return {"nodeName": NODE, "kubeconfig": str(kubeconfig), "rootDir": str(root),
            "readOnlyPort": free_port(), "apiWatchTimeout": "5s", "statusSweepFrequency": "1s",
            "apiRetryMaxDelay": "1s", "nodeLeaseRenewInterval": "1s",
            "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}}


def test_kill9_of_status_and_of_the_whole_agent(api: KubeApi, agent: Any,
                                                wait_for: Callable[..., Any],
                                                tmp_path: Path) -> None:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", user=f"system:node:{NODE}",
                                groups=("system:nodes",))
    api.store.create("pods", "default", api_pod("web"))
    root = tmp_path / "root"
    first = agent(config=config(kubeconfig, root))
    cid = wait_for(lambda: container(api, "web")[2] == "running" and container(api, "web")[0],
                   timeout=60, message="web running in the API")
    rv = api.store.get("pods", "default", "web")["metadata"]["resourceVersion"]
    # kill -9 of status: it reloads its statuses; nothing regresses in the API
    pid = first.wait_state("status", "RUNNING")["pid"]
    os.kill(pid, signal.SIGKILL)
    first.wait_state("status", "RUNNING", where=lambda r: r["pid"] != pid)
    # kill -9 of the whole agent, then a new one on the same rootDir
    pids = [first.wait_state(n, "RUNNING")["pid"] for n in ("source-api", "node", "status-api")]
    # the agent's own processes (subsystems, forkserver), not the containers nor their monitors
    pids += [p.pid for p in psutil.Process(first.proc.pid).children(recursive=True)
             if "forkserver" in " ".join(p.cmdline())
             or (p.name().startswith("pv-") and not p.name().startswith("pv-monitor"))]
    first.proc.kill()
    first.proc.wait()
    for p in pids:
        wait_for(lambda p=p: process_gone(p), timeout=30, message="the agent's processes go")
    lease_before = api.store.get("leases", "kube-node-lease", NODE)["spec"]["renewTime"]
    cfg = {**config(kubeconfig, root), "stopPodsOnExit": True}
    restarted = time.monotonic()
    second = agent(config=cfg)
    # the next agent's source-api watches on from the version it saved: no relist (status-api
    # lists the node's pods for their statuses: its own watch, its own User-Agent)
    pod_requests = wait_for(lambda: sorted(
        (r for r in list(api.requests) if r.path == "/api/v1/pods" and r.started > restarted
         and r.agent == "podvisor/source-api"),
        key=lambda r: r.started), timeout=30, message="the next agent's first pods request")
    assert "watch=1" in pod_requests[0].query.split("&")
    wait_for(lambda: api.store.get("leases", "kube-node-lease", NODE)["spec"]["renewTime"]
             != lease_before, timeout=30, message="the next agent renews the Lease")
    second.wait_state("status-api", "RUNNING")
    # the container was adopted, never restarted, and its status never went back
    wait_for(lambda: api.count("PATCH", "/pods/web/status", code=200) >= 1, timeout=30)
    assert container(api, "web") == (cid, 0, "running")
    assert int(api.store.get("pods", "default", "web")["metadata"]["resourceVersion"]) >= \
        int(rv)
    # the adopted pod goes when it leaves the API (and with it the first runtime's monitor)
    api.store.delete("pods", "default", "web", grace=0)
    wait_for(lambda: (get_pods(cfg["readOnlyPort"]) or {"items": [1]})["items"] == [],
             timeout=60, message="the adopted pod stopped")


@pytest.mark.slow
def test_api_server_away_60s(api: KubeApi, agent: Any, wait_for: Callable[..., Any],
                             tmp_path: Path) -> None:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", user=f"system:node:{NODE}",
                                groups=("system:nodes",))
    marks = tmp_path / "marks"
    marks.mkdir()
    go = marks / "go"
    api.store.create("pods", "default", api_pod("steady"))
    # exits 0 once the test creates `go`: a status change made while the API is away
    api.store.create("pods", "default", api_pod(
        "finisher", f"while [ ! -e {go} ]; do sleep 0.2; done", policy="Never"))
    agent(config={**config(kubeconfig, tmp_path / "root"), "stopPodsOnExit": True})
    steady = wait_for(lambda: container(api, "steady")[2] == "running" and
                      container(api, "steady")[0], timeout=60)
    wait_for(lambda: container(api, "finisher")[2] == "running", timeout=60)
    api.stop()
    go.touch()
    t0 = time.monotonic()
    wait_for(lambda: time.monotonic() - t0 >= 60, timeout=90, interval=1.0,
             message="60 s of outage")
    api.start()
    wait_for(lambda: api.store.get("pods", "default", "finisher")["status"].get("phase")
             == "Succeeded", timeout=30, message="the status made during the outage")
    assert container(api, "steady") == (steady, 0, "running")
