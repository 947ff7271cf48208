"""Helpers of the volume tests: PVs, claims and pods through the stand-in API server, an agent
config for it, and readers of what the API and the node show."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
import urllib3

from tests.support.kubeapi import ApiError, KubeApi
from tests.support.lifecycle import free_port

TOKEN = "summary-token"
COUNT = ("n=$(cat {data}/count 2>/dev/null || echo 0); echo $((n+1)) > {data}/count; "
         "echo $n > {marks}/seen; while true; do sleep 1; done")


def agent_config(api: KubeApi, tmp_path: Path, node: str, **extra: Any) -> dict[str, Any]:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", user=f"system:node:{node}",
                                groups=("system:nodes",))
    return {"nodeName": node, "kubeconfig": str(kubeconfig), "readOnlyPort": free_port(),
            "syncFrequency": "10m", "stopPodsOnExit": True, "volumeStatsAggPeriod": "1s",
            "nodeStatusUpdateFrequency": "1s",
            "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}, **extra}


def host_path_pv(name: str, path: Path, cls: str = "manual") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
        "storageClassName": cls, "hostPath": {"path": str(path), "type": "Directory"}}}


def claim(name: str, cls: str = "manual", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "accessModes": ["ReadWriteOnce"], "storageClassName": cls,
        "resources": {"requests": {"storage": "1Gi"}}, **spec}}


def counting_pod(name: str, node: str, volume: dict[str, Any], mount: Path, marks: Path,
                 **pod_spec: Any) -> dict[str, Any]:
    """A pod that counts its starts in the volume (``count``) and writes what it found
    (``seen``) into ``marks`` (a hostPath)."""
    return {"metadata": {"name": name, "labels": {"app": "web"}}, "spec": {
        "nodeName": node, "terminationGracePeriodSeconds": 1,
        "volumes": [volume, {"name": "marks", "hostPath": {"path": str(marks)}}],
        "containers": [{
            "name": "c", "image": "host",
            "command": ["sh", "-c", COUNT.format(data=mount, marks=marks)],
            "volumeMounts": [{"name": volume["name"], "mountPath": str(mount)},
                             {"name": "marks", "mountPath": str(marks)}]}], **pod_spec}}


def read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def phase(api: KubeApi, resource: str, name: str, ns: str = "default") -> str:
    try:
        obj = api.store.get(resource, ns if resource != "persistentvolumes" else "", name)
    except ApiError:
        return ""
    return str((obj.get("status") or {}).get("phase", ""))


def gone(api: KubeApi, resource: str, name: str, ns: str = "default") -> Callable[[], bool]:
    def check() -> bool:
        try:
            api.store.get(resource, ns, name)
        except ApiError:
            return True
        return False
    return check


def waiting_reason(api: KubeApi, name: str, ns: str = "default") -> str:
    try:
        pod = api.store.get("pods", ns, name)
    except ApiError:
        return ""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        return str(waiting.get("reason", ""))
    return ""


def events(api: KubeApi, reason: str, ns: str = "default") -> list[dict[str, Any]]:
    return [e for e in api.store.list("events", ns)[0] if e.get("reason") == reason]


def local_pv(name: str, path: Path, node: str, cls: str = "local") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
        "storageClassName": cls, "local": {"path": str(path)},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{
            "key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}}


def mounts_under(prefix: Path) -> list[str]:
    """Mount points at or under ``prefix`` in this (the test's, the node's) mount namespace."""
    real = str(prefix.resolve())
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if p == real or p.startswith(real + "/")]


def kill9(handle: Any, name: str, wait_for: Callable[..., Any]) -> None:
    old = handle.state(name)
    handle.call("kill", name=name, signal="KILL")
    wait_for(lambda: handle.state(name)["state"] == "RUNNING"
             and handle.state(name)["pid"] != old["pid"], 30.0)


def log_lines(handle: Any, process: str = "volumes") -> list[dict[str, Any]]:
    """The JSON lines of a process's log (every run of it)."""
    out = []
    with contextlib.suppress(OSError):
        for line in (handle.paths.logs_dir / f"{process}.log").read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def summary_auth(tmp_path: Path) -> dict[str, Any]:
    """The main port's ``authentication``: ``TOKEN`` (of a user the authorizer lets in)."""
    (tmp_path / "tokens.csv").write_text(f'{TOKEN},ops,1001,"ops"\n')
    return {"tokenFile": str(tmp_path / "tokens.csv"), "anonymous": {"enabled": False}}


def summary(port: int) -> dict[str, Any]:
    """``/stats/summary`` of the main port on ``port`` ({} until it answers)."""
    urllib3.disable_warnings()
    try:
        answer = requests.get(f"https://127.0.0.1:{port}/stats/summary", verify=False,
                              headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    except requests.RequestException:
        return {}
    return dict(answer.json()) if answer.status_code == 200 else {}


def pod_volumes(port: int, name: str) -> list[dict[str, Any]]:
    """The ``volume`` entries of pod ``name`` in ``/stats/summary``."""
    for pod in summary(port).get("pods", []):
        if pod["podRef"]["name"] == name:
            return list(pod.get("volume", []))
    return []
