"""Helpers for the lifecycle end-to-end tests (tests/services/syncloop/test_e2e_lifecycle_*.py).

Imported as ``tests.support.lifecycle``. Pods are static manifests in a temp dir run by a real
``podvisor run`` (the ``agent`` fixture of tests/conftest.py) with the embedded runtime; state is
read from ``/pods`` on the read-only port and from CRI. Container processes write their pid to
``<marks>/<name>.pid`` and, when they get TERM, ``<marks>/<name>.term``, so a test can check
their processes directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from podvisor.services.cri import new_runtime_client
from podvisor.services.cri.client import RuntimeClient


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_pods(port: int) -> dict[str, Any] | None:
    """GET /pods; None while the server is down or not synced (503)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/pods", timeout=5) as resp:
            data: dict[str, Any] = json.loads(resp.read().decode())
            return data
    except (urllib.error.URLError, OSError, ValueError):
        return None


def pod_yaml(name: str, command: str, *, policy: str = "Always", grace: int = 2,
             image: str = "host", container: str = "c") -> str:
    return (f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n"
            f"  restartPolicy: {policy}\n  terminationGracePeriodSeconds: {grace}\n"
            f"  containers:\n  - name: {container}\n    image: {image}\n"
            f"    command: [\"sh\", \"-c\", {command!r}]\n")


def marked(marks: Path, name: str, ignore_term: bool = False) -> str:
    """A long-running command that records its pid and (unless ignoring TERM) the TERM."""
    # "$$$$": the kubelet's $(VAR) expansion of the command turns "$$" into "$"
    pid = f"echo $$$$ > {marks}/{name}.pid.tmp && mv {marks}/{name}.pid.tmp {marks}/{name}.pid"
    if ignore_term:
        return f"trap '' TERM; {pid}; sleep 3600 & wait"
    return f"trap 'echo term > {marks}/{name}.term; exit 0' TERM; {pid}; sleep 3600 & wait"


def agent_config(manifests: Path, port: int, **extra: Any) -> dict[str, Any]:
    supervision = {"heartbeatInterval": "200ms", "shutdownTimeout": "30s",
                   **extra.pop("supervision", {})}
    return {"nodeName": "e2e", "staticPodPath": str(manifests), "fileCheckFrequency": "2s",
            "readOnlyPort": port, "port": 0, "opsPort": 0, "supervision": supervision, **extra}


def cri_for(handle: Any) -> RuntimeClient:
    return new_runtime_client(f"unix://{handle.paths.cri_socket}", timeout=5.0)


def summary(podlist: dict[str, Any]) -> dict[str, list[tuple[str, int, str]]]:
    """pod name -> [(containerID, restartCount, state key)] from a /pods answer."""
    out: dict[str, list[tuple[str, int, str]]] = {}
    for pod in podlist.get("items", []):
        statuses = pod.get("status", {}).get("containerStatuses", [])
        out[pod["metadata"]["name"]] = [
            (c.get("containerID", ""), c.get("restartCount", -1), next(iter(c.get("state", {})),
                                                                          ""))
            for c in statuses]
    return out


def all_running(podlist: dict[str, Any] | None, names: set[str]) -> bool:
    if podlist is None:
        return False
    items = {p["metadata"]["name"].rsplit("-", 1)[0]: p for p in podlist.get("items", [])}
    if set(items) != names:
        return False
    for pod in items.values():
        st = pod.get("status", {})
        cs = st.get("containerStatuses", [])
        if st.get("phase") != "Running" or not cs or any("running" not in c.get("state", {})
                                                         for c in cs):
            return False
    return True


def read_pid(marks: Path, name: str) -> int | None:
    try:
        return int((marks / f"{name}.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def container_pid(marker: str) -> int | None:
    """The pid of a container's ``sh -c SCRIPT MARKER`` (its $0 is the marker), seen from the
    host; None while there is none."""
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if len(argv) >= 4 and argv[0] == "sh" and argv[-1] == marker:
            return proc.pid
    return None


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_pids(pids: list[int]) -> None:
    """Best-effort SIGKILL of container processes a failed test may leave (by pid)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
