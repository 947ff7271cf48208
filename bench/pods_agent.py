"""A real `podvisor run` agent for bench/pods.py (not a test).

Same config shape as the e2e tests (tests/services/syncloop/test_e2e_*.py): a temp rootDir,
`staticPodPath` (a manifest dir watched by the built-in file source), `readOnlyPort` on 127.0.0.1,
the embedded runtime, `stopPodsOnExit: true`. Unlike the tests, heartbeats and log level keep their
defaults (1 s, info): this is what a user runs.

Process classification (idle figures): the agent's process tree (psutil children of the
`podvisor run` PID, recursive) minus every container process and every container monitor, both
read from `<rootDir>/runtime/containers/*.started.json` (`pid`, `monitor_pid`), and their
descendants. What remains is the supervisor, the forkserver, the `pv-<name>` subsystems, the
runtime's zygote and its pre-forked spare monitors.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil
import yaml
from cri_api.v1 import api_pb2 as pb

from podvisor.ipc.control import AgentNotRunning, ControlClient
from podvisor.ipc.paths import RunPaths
from podvisor.services.cri import RuntimeClient, new_runtime_client
from podvisor.services.runtime import procfs
from podvisor.services.syncloop import labels as L

NODE = "bench"
BIN = Path(sys.executable).parent
T = TypeVar("T")
MANIFEST = """apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: host
    imagePullPolicy: {pull}
    command: ["sleep", "{seconds}"]
{resources}"""
# `--limits`: every container gets a cgroup (limits at create) besides its security context
RESOURCES = """    resources:
      limits: {cpu: 100m, memory: 64Mi}
"""


def poll(predicate: Callable[[], T], timeout: float, interval: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def pod_name(name: str) -> str:
    """The name a static pod gets: `<name>-<node>`."""
    return f"{name}-{NODE}"


class Agent:
    def __init__(self, port: int, extra: dict[str, Any] | None = None) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="pvbp", dir="/tmp"))
        self.manifests = self.tmp / "manifests"
        self.staging = self.tmp / "staging"  # same filesystem: a rename drops a file at once
        self.manifests.mkdir()
        self.staging.mkdir()
        self.paths = RunPaths(self.tmp / "root")
        self.port = port
        config = {"rootDir": str(self.paths.root), "nodeName": NODE,
                  "staticPodPath": str(self.manifests), "readOnlyPort": port,
                  "stopPodsOnExit": True, "supervision": {"shutdownTimeout": "60s"},
                  "port": 0, "opsPort": 0, **(extra or {})}  # bench/ops.py measures the ops port
        (self.tmp / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        self.log = (self.tmp / "agent.stderr").open("wb")
        self.proc = subprocess.Popen(
            [str(BIN / "podvisor"), "run", "--config", str(self.tmp / "config.yaml")],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, cwd=str(self.tmp))
        self.control = ControlClient(self.paths.control, timeout=10.0)
        self.http: http.client.HTTPConnection | None = None
        self.cri: RuntimeClient | None = None
        self.seq = 0
        self.pull_policy = "IfNotPresent"
        self.limits = False  # RESOURCES in every manifest (a cgroup per container)

    # --- start / stop ------------------------------------------------------------------------

    def wait_ready(self, timeout: float = 60.0) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited {self.proc.returncode}; see {self.log.name}")
            try:
                self.control.call("status", timeout=1.0)
            except AgentNotRunning:
                return False
            return self.paths.cri_socket.exists() and self.pods() is not None
        poll(up, timeout, 0.05, "agent, CRI socket and /pods")
        self.cri = new_runtime_client(f"unix://{self.paths.cri_socket}", timeout=5.0)

    def stop(self) -> list[str]:
        """SIGTERM (stopPodsOnExit: pods are stopped within their grace), wait, then kill by PID
        whatever container or monitor is still alive. Returns what had to be killed."""
        if self.cri is not None:
            self.cri.close()
        if self.http is not None:
            self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        leftovers = []
        for pid in sorted(self.runtime_pids()):
            try:
                proc = psutil.Process(pid)
                leftovers.append(f"{pid} {' '.join(proc.cmdline())[:80]}")
                proc.kill()
            except psutil.Error:
                pass
        if os.environ.get("PVBENCH_KEEP"):
            print(f"  (kept {self.tmp})")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
        return leftovers

    # --- manifests ---------------------------------------------------------------------------

    def stage(self, name: str) -> Path:
        """Write a manifest into the staging dir (not yet seen by the source)."""
        self.seq += 1
        path = self.staging / f"{name}.yaml"
        path.write_text(MANIFEST.format(name=name, seconds=3600 + self.seq,
                                        pull=self.pull_policy,
                                        resources=RESOURCES if self.limits else ""),
                        encoding="utf-8")
        return path

    def drop(self, staged: Path) -> None:
        staged.rename(self.manifests / staged.name)

    def remove_all(self) -> None:
        for path in self.manifests.glob("*.yaml"):
            path.unlink()

    # --- observation -------------------------------------------------------------------------

    def pods(self) -> dict[str, Any] | None:
        """GET /pods on a kept-alive connection; None when the server does not answer 200."""
        for _ in range(2):
            try:
                if self.http is None:
                    self.http = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                self.http.request("GET", "/pods")
                resp = self.http.getresponse()
                body = resp.read()
                if resp.status != 200:
                    return None
                result: dict[str, Any] = json.loads(body)
                return result
            except (OSError, http.client.HTTPException, ValueError):
                if self.http is not None:
                    self.http.close()
                self.http = None
        return None

    def running_names(self) -> set[str]:
        """Pod names whose every container is running in /pods."""
        podlist = self.pods() or {}
        out = set()
        for pod in podlist.get("items", []):
            statuses = pod.get("status", {}).get("containerStatuses", [])
            if statuses and all("running" in s.get("state", {}) for s in statuses):
                out.add(pod["metadata"]["name"])
        return out

    def pod_count(self) -> int:
        return len((self.pods() or {}).get("items", []))

    def containers(self, name: str) -> list[pb.Container]:
        assert self.cri is not None
        return self.cri.list_containers(pb.ContainerFilter(
            label_selector={L.POD_NAME: pod_name(name)}))

    def all_containers(self) -> list[pb.Container]:
        assert self.cri is not None
        return self.cri.list_containers()

    def started(self, container_id: str) -> dict[str, Any]:
        path = self.paths.runtime_dir / "containers" / f"{container_id}.started.json"
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return data

    def runtime_pids(self) -> set[int]:
        """Every container and monitor PID the runtime recorded that still names the same
        (living) process: (pid, start ticks) as in started.json, so a reused PID is never
        counted or killed."""
        out: set[int] = set()
        for path in self.paths.runtime_dir.glob("containers/*.started.json"):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                pairs = [(int(data["pid"]), int(data["pid_ticks"] or 0)),
                         (int(data["monitor_pid"]), int(data["monitor_ticks"] or 0))]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            out.update(pid for pid, ticks in pairs if pid and procfs.is_alive(pid, ticks))
        return out

    def container_pids(self) -> set[int]:
        """The containers' own processes (the workload; their monitors excluded), alive."""
        out: set[int] = set()
        for path in self.paths.runtime_dir.glob("containers/*.started.json"):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                pid, ticks = int(data["pid"]), int(data["pid_ticks"] or 0)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if pid and procfs.is_alive(pid, ticks):
                out.add(pid)
        return out

    def agent_processes(self) -> list[psutil.Process]:
        """The agent's own processes (see the module docstring for the classification)."""
        root = psutil.Process(self.proc.pid)
        # one table of parents for all (psutil's children() reads every process each call:
        # quadratic with 1,000 pods' 2,000 monitors and containers)
        kids: dict[int, list[int]] = {}
        for proc in psutil.process_iter(["ppid"]):
            kids.setdefault(proc.info["ppid"] or 0, []).append(proc.pid)
        excluded: set[int] = set()
        todo = list(self.runtime_pids())
        while todo:
            pid = todo.pop()
            if pid not in excluded:
                excluded.add(pid)
                todo.extend(kids.get(pid, []))
        out, todo = [root], list(kids.get(root.pid, []))
        while todo:
            pid = todo.pop()
            todo.extend(kids.get(pid, []))
            if pid not in excluded:
                with contextlib.suppress(psutil.Error):
                    out.append(psutil.Process(pid))
        return out

    def pod_processes(self) -> list[psutil.Process]:
        out = []
        for pid in self.runtime_pids():
            with contextlib.suppress(psutil.Error):
                out.append(psutil.Process(pid))
        return out


def alive_descendants() -> bool:
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            pass
    return False


def kill_descendants() -> list[str]:
    """Reap our zombies; kill (by PID) and list whatever descendant is still alive."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                if proc.ppid() == os.getpid():
                    os.waitpid(proc.pid, os.WNOHANG)
                continue
            out.append(f"{proc.pid} {' '.join(proc.cmdline())[:80]}")
            proc.kill()
        except (psutil.Error, ChildProcessError):
            pass
    return out
