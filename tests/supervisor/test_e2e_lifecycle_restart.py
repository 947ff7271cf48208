"""End to end: stopping and starting the whole agent, with the real agent and embedded runtime.

- SIGTERM to `podvisor run`: every agent process exits, the pods' containers keep running (same
  pids), the agent says how many pods it left running and how to stop them; a new agent on the
  same rootDir adopts them (same container IDs, restartCount 0, Running in /pods). Then
  `podvisorctl shutdown --pods` stops them: TERM within the grace period, KILL for a container
  that ignores TERM, nothing left in the runtime after the agent exits.
- `--stop-pods-on-exit` with SIGTERM: the pods are stopped through the StopAllPods handshake, so
  a container that ignores TERM with a grace longer than the sync loop's own stop timeout is still
  KILLed after its grace and nothing is left running.
- kill -9 of the supervisor: every agent process exits (parent-death signal), pods keep running,
  and a new agent adopts them without restarting them.
- SIGINT (Ctrl-C), then the exact command the agent printed, run as printed with no agent: every
  pod stopped (its preStop hook as recorded on its container: exec, and httpGet to a named
  port; TERM, KILL after the grace for the one ignoring TERM), exit 0,
  nothing left in the runtime, under `pods/` or as a process.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.support.lifecycle import (
    agent_config,
    all_running,
    free_port,
    get_pods,
    kill_pids,
    marked,
    pid_alive,
    pod_yaml,
    read_pid,
    summary,
)

NAMES = {"a", "b", "stubborn"}  # "stubborn" ignores TERM


@dataclass
class Pods:
    manifests: Path
    marks: Path
    port: int

    def pids(self) -> dict[str, int]:
        return {n: p for n in sorted(NAMES) if (p := read_pid(self.marks, n)) is not None}

    def termed(self, name: str) -> bool:
        return (self.marks / f"{name}.term").exists()


@pytest.fixture
def pods() -> Iterator[Pods]:
    manifests = Path(tempfile.mkdtemp(prefix="pvrs", dir="/tmp"))
    marks = Path(tempfile.mkdtemp(prefix="pvrsm", dir="/tmp"))
    p = Pods(manifests, marks, free_port())
    yield p
    kill_pids([pid for pid in p.pids().values() if pid_alive(pid)])  # only after a failure
    shutil.rmtree(manifests, ignore_errors=True)
    shutil.rmtree(marks, ignore_errors=True)


def write_pods(p: Pods, stubborn_grace: int) -> None:
    for name in ("a", "b"):
        (p.manifests / f"{name}.yaml").write_text(
            pod_yaml(name, marked(p.marks, name), grace=10), "utf-8")
    (p.manifests / "stubborn.yaml").write_text(pod_yaml(
        "stubborn", marked(p.marks, "stubborn", ignore_term=True), grace=stubborn_grace), "utf-8")


def start(agent: Any, p: Pods, root: Path | None = None, **extra: Any) -> Any:
    args = tuple(extra.pop("extra_args", ()))
    cfg = agent_config(p.manifests, p.port, **extra)
    if root is not None:
        cfg["rootDir"] = str(root)
    return agent(config=cfg, extra_args=args)


def running_podlist(p: Pods, wait_for: Any) -> dict[str, Any]:
    body: dict[str, Any] = wait_for(
        lambda: (b := get_pods(p.port)) and all_running(b, NAMES) and b, 90.0, 0.1,
        "every pod Running in /pods")
    return body


def agent_processes(handle: Any, container_pids: list[int]) -> list[psutil.Process]:
    """The agent and its descendants, without the containers' monitors and containers (which
    are meant to outlive it)."""
    keep_out = set(container_pids)
    for pid in container_pids:
        with contextlib.suppress(psutil.Error):
            keep_out.add(psutil.Process(pid).ppid())  # the container's monitor
    root = psutil.Process(handle.proc.pid)
    out = [root]
    for proc in root.children(recursive=True):
        try:
            if proc.pid in keep_out or os.getsid(proc.pid) in container_pids:
                continue
        except (psutil.Error, OSError):
            continue
        out.append(proc)
    return out


def output(handle: Any) -> str:
    """What the agent printed (also after `stop()`)."""
    return str(handle.stderr_path.read_text(encoding="utf-8", errors="replace"))


def all_gone(procs: list[psutil.Process]) -> bool:
    return not any(pid_alive(proc.pid) for proc in procs)


def runtime_records(root: Path) -> list[str]:
    """Sandbox and container records the embedded runtime still keeps on disk."""
    out = []
    for kind in ("sandboxes", "containers"):
        d = root / "runtime" / kind
        out += [f"{kind}/{x.name}" for x in d.iterdir()] if d.is_dir() else []
    return out


@pytest.mark.timeout(170)
def test_sigterm_leaves_pods_new_agent_adopts_then_shutdown_pods(
        agent: Any, pods: Pods, wait_for: Any) -> None:
    write_pods(pods, stubborn_grace=3)
    first = start(agent, pods)
    before = summary(running_podlist(pods, wait_for))
    pids = wait_for(lambda: (d := pods.pids()) and len(d) == 3 and d, 10.0)
    procs = agent_processes(first, list(pids.values()))
    assert len(procs) >= 6, procs  # supervisor, forkserver, the children, the zygote
    assert first.stop() == 0
    wait_for(lambda: all_gone(procs), 30.0, 0.05, "every agent process to exit")
    assert all(pid_alive(pid) for pid in pids.values()), "a container died with the agent"
    assert not any(pods.termed(n) for n in NAMES)
    assert "podvisor: left 3 pods running" in output(first)
    assert f"--root-dir {first.paths.root} shutdown --pods" in output(first)

    second = start(agent, pods, root=first.paths.root)
    again = summary(running_podlist(pods, wait_for))
    assert again == before  # same container IDs, restartCount 0
    assert all(count == 0 for cs in again.values() for _, count, _ in cs)
    assert pods.pids() == pids and all(pid_alive(pid) for pid in pids.values())

    out = second.ctl("shutdown", "--pods")
    assert out.returncode == 0, out.stderr
    second.proc.wait(60)
    assert second.proc.returncode == 0
    assert not any(pid_alive(pid) for pid in pids.values()), "a container outlived shutdown --pods"
    assert pods.termed("a") and pods.termed("b")
    assert runtime_records(second.paths.root) == []
    assert "left" not in output(second).split("agent.stopped")[-1]


@pytest.mark.timeout(120)
def test_stop_pods_on_exit_flag_kills_after_grace(agent: Any, pods: Pods, wait_for: Any) -> None:
    # a grace longer than the sync loop's stopTimeout (5 s): only the StopAllPods handshake,
    # not the sync loop's own SIGTERM path, outlasts it
    write_pods(pods, stubborn_grace=7)
    handle = start(agent, pods, extra_args=("--stop-pods-on-exit",))
    running_podlist(pods, wait_for)
    pids = wait_for(lambda: (d := pods.pids()) and len(d) == 3 and d, 10.0)
    procs = agent_processes(handle, list(pids.values()))
    handle.proc.send_signal(signal.SIGTERM)
    assert handle.proc.wait(60) == 0
    wait_for(lambda: all_gone(procs), 30.0, 0.05, "every agent process to exit")
    assert not any(pid_alive(pid) for pid in pids.values()), "a container outlived the agent"
    assert pods.termed("a") and pods.termed("b") and not pods.termed("stubborn")
    assert runtime_records(handle.paths.root) == []
    handle.stop()
    assert "agent.pods_stopped" in output(handle) and "left 3 pods" not in output(handle)


@pytest.mark.timeout(150)
def test_stop_pods_on_exit_right_after_the_sync_loop_restarted(
        agent: Any, pods: Pods, wait_for: Any) -> None:
    """SIGTERM with stopPodsOnExit moments after a kill -9 of the sync loop: the new one may not
    have subscribed yet (the bus drops the StopAllPods it missed: the supervisor asks again
    until answered) nor loaded a pod (it stops every pod the runtime lists). The agent used to
    wait out stopPodsTimeout, then left the pods running."""
    write_pods(pods, stubborn_grace=2)
    handle = start(agent, pods, stopPodsOnExit=True)
    running_podlist(pods, wait_for)
    pids = wait_for(lambda: (d := pods.pids()) and len(d) == 3 and d, 10.0)
    old = handle.state("syncloop")["pid"]
    handle.call("kill", name="syncloop", signal="KILL")
    handle.wait_state("syncloop", "RUNNING", where=lambda r: r["pid"] != old)
    handle.proc.send_signal(signal.SIGTERM)
    assert handle.proc.wait(60) == 0
    assert not any(pid_alive(pid) for pid in pids.values()), "a container outlived the agent"
    assert runtime_records(handle.paths.root) == []
    handle.stop()
    assert "agent.pods_stopped" in output(handle) and "left 3 pods" not in output(handle)


@pytest.mark.timeout(150)
def test_kill9_fork_server_restarts_every_subsystem_pods_untouched(
        agent: Any, pods: Pods, wait_for: Any) -> None:
    """The fork server's children are every subsystem: killed, it takes them all down (their
    parent-death signal); the supervisor starts a new server and every subsystem through it,
    and the pods' containers are untouched (same IDs and processes, no restart counted)."""
    write_pods(pods, stubborn_grace=2)
    handle = start(agent, pods, stopPodsOnExit=True)
    before = summary(running_podlist(pods, wait_for))
    pids = wait_for(lambda: (d := pods.pids()) and len(d) == 3 and d, 10.0)
    names = [n for n, row in handle.status().items() if row["state"] == "RUNNING"]
    old = {n: handle.state(n)["pid"] for n in names}
    [server] = [p for p in psutil.Process(handle.proc.pid).children()
                if "podvisor.supervisor.forkserver" in " ".join(p.cmdline())]
    server.kill()
    for name in names:
        handle.wait_state(name, "RUNNING", timeout=60.0,
                          where=lambda r, name=name: r["pid"] != old[name])
    [new_server] = [p for p in psutil.Process(handle.proc.pid).children()
                    if "podvisor.supervisor.forkserver" in " ".join(p.cmdline())]
    assert new_server.pid != server.pid
    assert all(psutil.Process(handle.state(n)["pid"]).ppid() == new_server.pid for n in names)
    # the old ones got their parent-death signal (SIGTERM): they stop as on any stop
    wait_for(lambda: not any(pid_alive(pid) for pid in old.values()), 30.0, 0.05,
             "the old subsystems to exit")
    again = summary(running_podlist(pods, wait_for))
    assert again == before  # same container IDs, restartCount 0
    assert pods.pids() == pids and not any(pods.termed(n) for n in NAMES)
    assert handle.stop() == 0


@pytest.mark.timeout(150)
def test_kill9_supervisor_pods_survive_and_are_adopted(
        agent: Any, pods: Pods, wait_for: Any) -> None:
    write_pods(pods, stubborn_grace=2)
    first = start(agent, pods, stopPodsOnExit=True)
    before = summary(running_podlist(pods, wait_for))
    pids = wait_for(lambda: (d := pods.pids()) and len(d) == 3 and d, 10.0)
    procs = agent_processes(first, list(pids.values()))
    first.proc.kill()
    first.proc.wait(10)
    wait_for(lambda: all_gone(procs), 30.0, 0.05, "every agent process to exit (parent death)")
    assert all(pid_alive(pid) for pid in pids.values()), "a container died with the agent"
    assert not any(pods.termed(n) for n in NAMES)

    second = start(agent, pods, root=first.paths.root, stopPodsOnExit=True)
    again = summary(running_podlist(pods, wait_for))
    assert again == before
    assert pods.pids() == pids and all(pid_alive(pid) for pid in pids.values())
    assert second.stop() == 0  # stopPodsOnExit: the pods go with it
    assert not any(pid_alive(pid) for pid in pids.values())


PRINTED = re.compile(r"podvisor: left (\d+) pods? running; stop them with `([^`]+)`")


@pytest.mark.timeout(170)
def test_sigint_then_the_printed_command_stops_every_pod(
        agent: Any, pods: Pods, wait_for: Any) -> None:
    write_pods(pods, stubborn_grace=3)
    # pods a and b have a preStop hook: with no agent (no pod spec) it runs from the container's
    # record: a's exec, b's httpGet to its named port (recorded with the container's ports)
    a = yaml.safe_load((pods.manifests / "a.yaml").read_text("utf-8"))
    a["spec"]["containers"][0]["lifecycle"] = {"preStop": {"exec": {"command": [
        "sh", "-c", f"echo hook > {pods.marks}/a.prestop"]}}}
    (pods.manifests / "a.yaml").write_text(yaml.safe_dump(a), "utf-8")
    hits: list[str] = []
    server = hook_server(hits)
    b = yaml.safe_load((pods.manifests / "b.yaml").read_text("utf-8"))
    b["spec"]["containers"][0]["ports"] = [{"name": "web",
                                            "containerPort": server.server_address[1]}]
    b["spec"]["containers"][0]["lifecycle"] = {"preStop": {"httpGet": {
        "port": "web", "path": "/bye", "host": "127.0.0.1"}}}
    (pods.manifests / "b.yaml").write_text(yaml.safe_dump(b), "utf-8")
    try:
        stop_with_the_printed_command(agent, pods, wait_for)
    finally:
        server.shutdown()
        server.server_close()
    assert hits == ["/bye"], "b's httpGet preStop hook did not run once"


def hook_server(hits: list[str]) -> http.server.ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 recording the paths it is asked for (a hook's target)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop_with_the_printed_command(agent: Any, pods: Pods, wait_for: Any) -> None:
    handle = start(agent, pods)
    running_podlist(pods, wait_for)
    pids = wait_for(lambda: (d := pods.pids()) and len(d) == 3 and d, 10.0)
    procs = agent_processes(handle, list(pids.values()))
    handle.proc.send_signal(signal.SIGINT)  # Ctrl-C
    assert handle.proc.wait(60) == 0
    wait_for(lambda: all_gone(procs), 30.0, 0.05, "every agent process to exit")
    assert all(pid_alive(pid) for pid in pids.values()), "a container died with the agent"
    found = PRINTED.search(output(handle))
    assert found is not None, output(handle)[-3000:]
    assert found.group(1) == "3"

    done = subprocess.run(shlex.split(found.group(2)), capture_output=True, text=True,
                          timeout=120, cwd="/")
    assert done.returncode == 0, (found.group(2), done.stdout, done.stderr)
    assert not any(pid_alive(pid) for pid in pids.values()), "a container outlived the command"
    assert pods.termed("a") and pods.termed("b") and not pods.termed("stubborn")
    assert (pods.marks / "a.prestop").read_text() == "hook\n", "a's preStop hook did not run"
    for name in NAMES:
        assert re.search(rf"^stopped pod default/{name}-e2e \(uid \S+\): 1 running container, "
                         rf"grace {3 if name == 'stubborn' else 10}s$", done.stdout, re.M), \
            done.stdout
    assert "stopped 3 pods" in done.stdout
    root = handle.paths.root
    assert runtime_records(root) == []
    assert list((root / "pods").iterdir()) == []
    assert not (root / "run" / "cri.sock").exists()
    # once more: nothing to stop, still exit 0
    again = subprocess.run(shlex.split(found.group(2)), capture_output=True, text=True,
                           timeout=60, cwd="/")
    assert again.returncode == 0 and "stopped 0 pods" in again.stdout, again
