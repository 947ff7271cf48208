"""source-api end to end: a real agent (embedded runtime) with a kubeconfig for the stand-in API
server (HTTPS, client certificate); pods bound to the node run, other nodes' pods and mirror
pods do not, a pod removed from the API stops, a restart of source-api restarts no pod, and a
pod larger than the Node's allocatable is rejected (OutOfcpu) with that status in the API."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.kubeapi import KubeApi
from tests.support.lifecycle import free_port, get_pods

NODE = "e2e"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    server.start()
    yield server
    server.stop()


def api_pod(name: str, node: str = NODE, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, **meta}, "spec": {
        "nodeName": node, "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 2, "restartPolicy": "Always",
        "containers": [{"name": "c", "image": "host",
                        "command": ["sh", "-c", "sleep 3600"]}]}}


def _saved_with(path: Path, name: str) -> dict[str, Any] | None:
    """source-api's saved resume point when it holds the pod ``name``."""
    try:
        saved: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    names = {i["metadata"]["name"] for i in saved.get("items", [])}
    return saved if name in names else None


def _pod_requests_since(api: KubeApi, since: float) -> list[Any]:
    """Pod list/watch requests the stand-in received (started) after ``since``, in order."""
    return sorted((r for r in list(api.requests)
                   if r.path == "/api/v1/pods" and r.started > since), key=lambda r: r.started)


def _query(request: Any) -> dict[str, str]:
    """The watch-relevant part of a request's query."""
    q = urllib.parse.parse_qs(request.query)
    return {k: v[0] for k, v in q.items() if k in ("watch", "resourceVersion")}


def running(port: int) -> dict[str, str]:
    """name -> container ID of every pod the agent runs."""
    pods = get_pods(port) or {}
    out = {}
    for pod in pods.get("items", []):
        cs = pod.get("status", {}).get("containerStatuses") or []
        if cs and all("running" in c.get("state", {}) for c in cs):
            out[pod["metadata"]["name"]] = cs[0].get("containerID", "")
    return out


def test_api_pods_run_mirror_and_foreign_pods_do_not(api: KubeApi, agent: Any,
                                                      wait_for: Callable[..., Any],
                                                      tmp_path: Path) -> None:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", user=f"system:node:{NODE}",
                                groups=("system:nodes",))
    port = free_port()
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    api.store.create("pods", "default", api_pod("web"))
    api.store.create("pods", "default", api_pod("elsewhere", node="other"))
    api.store.create("pods", "default", api_pod(
        "mirror-e2e", annotations={"kubernetes.io/config.mirror": "abc"}))
    handle = agent(config={"nodeName": NODE, "readOnlyPort": port, "kubeconfig": str(kubeconfig),
                    "apiWatchTimeout": "5s", "stopPodsOnExit": True,
                    "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}})
    first = wait_for(lambda: running(port).get("web") and running(port), timeout=60,
                     message="the API pod running")
    assert set(first) == {"web"}
    # its events reach the API as core/v1 Events (events-api)
    def web_events() -> set[str]:
        items, _ = api.store.list("events", "default")
        return {e["reason"] for e in items if e["involvedObject"].get("name") == "web"}

    wait_for(lambda: "Started" in web_events(), timeout=30, message="web's events in the API")
    # a pod added while the watch is open runs too
    api.store.create("pods", "default", api_pod("late"))
    wait_for(lambda: {"web", "late"} <= set(running(port)), timeout=60)
    # kill -9 of source-api: it resumes the watch from its saved version, no relist; nothing
    # restarts
    resume = handle.paths.state_dir / "source-api.json"
    wait_for(lambda: _saved_with(resume, "late"), timeout=30,
             message="the resume point holds late")
    pid = handle.wait_state("source-api", "RUNNING")["pid"]
    # the last point written before the kill: read while the process is stopped (a kill alone
    # lets a save in flight land after the read: resourceVersion 42 resumed, 40 read)
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, timeout=30,
             message="source-api stopped")
    saved = _saved_with(resume, "late")
    assert saved is not None
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    handle.wait_state("source-api", "RUNNING", where=lambda r: r["pid"] != pid)
    first_after = wait_for(lambda: _pod_requests_since(api, killed), timeout=30,
                           message="source-api's first request after the kill")[0]
    assert _query(first_after) == {"watch": "1", "resourceVersion": saved["resourceVersion"]}
    assert running(port)["web"] == first["web"]
    # a saved version the server no longer has (compacted away while source-api was frozen):
    # 410 Gone -> a relist; nothing restarts
    wait_for(lambda: _pod_requests_since(api, killed), timeout=30)
    pid = handle.wait_state("source-api", "RUNNING")["pid"]
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, timeout=30,
             message="source-api stopped")
    stale = _saved_with(resume, "late")
    assert stale is not None
    api.store.create("pods", "default", api_pod("moved-on", node="other"))
    api.store.compact()
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    handle.wait_state("source-api", "RUNNING", where=lambda r: r["pid"] != pid)
    reqs = wait_for(lambda: (lambda r: r if any("watch" not in _query(x) for x in r) else None)(
        _pod_requests_since(api, killed)), timeout=30, message="a relist after 410 Gone")
    assert _query(reqs[0]) == {"watch": "1", "resourceVersion": stale["resourceVersion"]}
    assert "watch" not in _query(reqs[1])  # the relist
    wait_for(lambda: (lambda s: s and int(s["resourceVersion"]) > int(stale["resourceVersion"]))(
        _saved_with(resume, "late")), timeout=30, message="a new resume point after the relist")
    assert running(port)["web"] == first["web"]
    # removed from the API (grace 0): the agent stops it
    api.store.delete("pods", "default", "late", grace=0)

    def late_gone() -> bool:
        pods = get_pods(port)
        return pods is not None and all(p["metadata"]["name"] != "late"
                                        for p in pods.get("items", []))

    wait_for(late_gone, timeout=60, message="late stopped")
    assert running(port)["web"] == first["web"]
    # admission against the Node's allocatable: a pod asking for more CPU than the node has
    big = api_pod("big")
    big["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100000"}}
    api.store.create("pods", "default", big)

    def rejected() -> dict[str, Any] | None:
        st = api.store.get("pods", "default", "big").get("status", {})
        return st if st.get("phase") == "Failed" else None

    status = wait_for(rejected, timeout=30, message="big Failed in the API")
    assert status["reason"] == "OutOfcpu"
    assert status["message"].startswith("Pod was rejected: Node didn't have enough resource: "
                                        "cpu, requested: 100000000")  # the kubelet's rejectPod
    assert "big" not in running(port)
