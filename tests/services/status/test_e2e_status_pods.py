"""End to end with the real agent: 20 manifests -> /pods Running and Ready; kill -9 of status,
server, pleg and syncloop, one at a time. Strict: every answer seen (from the HTTP server and from
snapshots of the ``statuses`` map) shows every pod Ready, with the same conditions'
``lastTransitionTime``, the same container IDs and restart counts, and ``_version`` never going
backwards.

Synchronisation is functional: after each kill the test waits until the restarted process has
caught up (for status and for status' view of a restarted pleg/syncloop: the ``status.inputs``
log event naming the new incarnation's map epochs), polling all the while.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.clone import MapReplica
from podvisor.ipc.maps import declared
from podvisor.ipc.paths import RunPaths
from podvisor.supervisor.registry import BUILTINS

N_PODS = 20
CONDITIONS = {"PodScheduled": "True", "PodReadyToStartContainers": "True",
              "Initialized": "True", "ContainersReady": "True", "Ready": "True"}
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


def status_ready(status: dict[str, Any]) -> bool:
    conds = {c["type"]: c["status"] for c in status.get("conditions", [])}
    return status.get("phase") == "Running" and conds == CONDITIONS


def all_ready(podlist: dict[str, Any]) -> bool:
    items = podlist.get("items", [])
    return len(items) == N_PODS and all(status_ready(p["status"]) for p in items)


def pod_fingerprint(status: dict[str, Any]) -> dict[str, Any]:
    """What must not change across restarts: containers, restart counts, transition times."""
    return {
        "containers": [(c.get("containerID"), c.get("restartCount"))
                       for c in status.get("containerStatuses", [])],
        "conditions": {c["type"]: (c["status"], c.get("lastTransitionTime"))
                       for c in status.get("conditions", [])},
        "startTime": status.get("startTime"),
    }


def snapshot(zctx: Any, paths: RunPaths, name: str) -> tuple[str | None, dict[str, Any]] | None:
    """One snapshot of a replicated map from its owner: (epoch, items), None if it is down."""
    replica = MapReplica(zctx, paths, declared(name), clock=SYSTEM_CLOCK)
    try:
        return (replica.epoch, replica.items()) if replica.sync(timeout=1.0) else None
    finally:
        replica.close()


def log_events(paths: RunPaths, process: str, event: str) -> list[dict[str, Any]]:
    out = []
    for log in sorted(paths.logs_dir.glob(f"{process}.log*")):
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line being written
            if isinstance(rec, dict) and rec.get("event") == event:
                out.append(rec)
    return out


def dump_logs(paths: RunPaths) -> None:
    """On failure: the agent's logs (warnings, errors and status/pleg/syncloop events)."""
    keep = ("status.", "pleg.", "syncloop.pod", "process.state", "child.")
    for log in sorted(paths.logs_dir.glob("*.log")) if paths.logs_dir.is_dir() else []:
        print(f"--- {log.name}")
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            if '"level": "warning"' in line or '"level": "error"' in line or any(
                    f'"event": "{k}' in line for k in keep):
                print(line[:600])


class Observer:
    """Polls /pods and the ``statuses`` map; every answer is checked against the baseline."""

    def __init__(self, port: int, paths: RunPaths, zctx: Any) -> None:
        self.port, self.paths, self.zctx = port, paths, zctx
        self.baseline: dict[str, Any] = {}  # pod name -> fingerprint (from /pods)
        self.by_uid: dict[str, Any] = {}  # pod uid -> fingerprint
        self.versions: dict[str, int] = {}
        self.problems: list[str] = []
        self.answers = 0

    def podlist(self) -> dict[str, Any] | None:
        try:
            code, body = get(self.port, "/pods")
        except (OSError, ValueError):
            return None  # the server is down
        return body if code == 200 else None

    def set_baseline(self, podlist: dict[str, Any]) -> None:
        self.baseline = {p["metadata"]["name"]: pod_fingerprint(p["status"])
                         for p in podlist["items"]}
        self.by_uid = {p["metadata"]["uid"]: pod_fingerprint(p["status"])
                       for p in podlist["items"]}

    def _check(self, where: str, key: str, status: dict[str, Any], expected: Any) -> None:
        if not status_ready(status):
            self.problems.append(f"{where}: {key} not Ready: {status}")
        elif pod_fingerprint(status) != expected:
            self.problems.append(f"{where}: {key} changed: {pod_fingerprint(status)} "
                                 f"!= {expected}")

    def observe(self, phase: str) -> bool:
        """One round; True when /pods answered (every check is recorded in ``problems``)."""
        body = self.podlist()
        if body is not None:
            self.answers += 1
            if len(body.get("items", [])) != N_PODS:
                self.problems.append(f"{phase}: /pods has {len(body.get('items', []))} pods")
            for pod in body.get("items", []):
                name = pod["metadata"]["name"]
                self._check(f"{phase} /pods", name, pod["status"], self.baseline.get(name))
        snap = snapshot(self.zctx, self.paths, "statuses")
        if snap is not None:
            statuses = snap[1]
            if set(statuses) != set(self.by_uid):
                self.problems.append(f"{phase}: statuses map has {len(statuses)} pods")
            for uid, value in statuses.items():
                self._check(f"{phase} statuses", uid, value.status.to_dict(),
                            self.by_uid.get(uid))
                version = value.version
                if version < self.versions.get(uid, 0):
                    self.problems.append(f"{phase}: {uid} _version {version} went back from "
                                         f"{self.versions[uid]}")
                self.versions[uid] = max(version, self.versions.get(uid, 0))
        return body is not None


def source_process() -> dict[str, Any]:
    """The file source as a custom process until the supervisor lists it as a built-in."""
    if any(b.module.endswith("sources.file_main") for b in BUILTINS):
        return {}
    return {"source-file": {"module": "podvisor.services.sources.file_main"}}


def caught_up(handle: Any, obs: Observer, name: str, new_pid: int,
              epoch_before: str | None) -> Callable[[], bool]:
    """The predicate telling that the restarted ``name`` has caught up, observing meanwhile."""
    paths: RunPaths = handle.paths

    def status_inputs(**match: Any) -> bool:
        return any(all(rec.get(k) == v for k, v in match.items())
                   for rec in log_events(paths, "status", "status.inputs"))

    def check() -> bool:
        answered = obs.observe(f"after kill -9 {name}")
        if name == "server":
            return answered
        if name == "status":
            return answered and status_inputs(pid=new_pid)
        owner_map = {"pleg": "pleg", "syncloop": "desired"}[name]
        snap = snapshot(obs.zctx, paths, owner_map)
        if snap is None or snap[0] == epoch_before:
            return False
        return answered and status_inputs(**{f"{owner_map}_epoch": snap[0]})
    return check


@pytest.mark.timeout(240)
def test_twenty_pods_survive_kill_of_status_server_pleg_syncloop(
        agent: Any, wait_for: Any) -> None:
    port = free_port()
    manifests = Path(tempfile.mkdtemp(prefix="pvman", dir="/tmp"))
    zctx: zmq.Context[Any] = zmq.Context()
    paths = RunPaths(manifests / "no-agent")
    try:
        for i in range(N_PODS):
            (manifests / f"web{i}.yaml").write_text(MANIFEST.format(i=i), encoding="utf-8")
        handle = agent(wait=False, config={
            "nodeName": "e2e", "port": 0, "staticPodPath": str(manifests), "readOnlyPort": port,
            "stopPodsOnExit": True, "opsPort": 0,
            "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s",
                            "processes": source_process()}})
        paths = handle.paths
        handle.wait_ready()
        obs = Observer(port, handle.paths, zctx)
        first = wait_for(lambda: (b := obs.podlist()) and all_ready(b) and b, 90.0)
        obs.set_baseline(first)
        # the embedded runtime runs every pod in the host network: its pod IP is the host's
        assert {(p["status"]["podIP"], p["status"]["podIPs"][0]["ip"], p["status"]["hostIP"])
                for p in first["items"]} == {("127.0.0.1", "127.0.0.1", "127.0.0.1")}
        # healthy, and saying that pods share the node's network (networkPlugin: host)
        assert wait_for(lambda: (h := get(port, "/healthz"))[0] == 200
                        and "[!]runtime-network host network mode: networkPlugin: host" in h[1]
                        and h[1].endswith("healthz check passed"), 30.0)
        code, running = get(port, "/runningpods/")
        assert code == 200 and len(running["items"]) == N_PODS
        for _ in range(3):
            obs.observe("steady")
        for name in ("status", "server", "pleg", "syncloop"):
            owner_map = {"pleg": "pleg", "syncloop": "desired"}.get(name)
            before = snapshot(zctx, handle.paths, owner_map) if owner_map else None
            old_pid = handle.state(name)["pid"]
            handle.call("kill", name=name, signal="KILL")
            row = handle.wait_state(name, "RUNNING", 30.0,
                                    lambda r, old=old_pid: bool(r["pid"] != old))
            wait_for(caught_up(handle, obs, name, row["pid"], before[0] if before else None),
                     60.0, message=f"{name} restarted and caught up")
            for _ in range(3):  # a few more answers after the catch-up
                obs.observe(f"after kill -9 {name}")
            assert not obs.problems, "\n".join(obs.problems[:5])
        js = json.loads(handle.ctl("pods", "--json").stdout)
        assert {p["metadata"]["name"]: pod_fingerprint(p["status"])
                for p in js["items"]} == obs.baseline
        out = handle.ctl("pods")
        assert out.returncode == 0 and out.stdout.count("Running") == N_PODS
    except BaseException:
        dump_logs(paths)
        raise
    finally:
        if os.environ.get("PODVISOR_E2E_KEEP_LOGS") and paths.logs_dir.is_dir():
            shutil.copytree(paths.logs_dir, os.environ["PODVISOR_E2E_KEEP_LOGS"],
                            dirs_exist_ok=True)
        zctx.destroy(linger=0)
        shutil.rmtree(manifests, ignore_errors=True)
