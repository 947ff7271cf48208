"""supervisord as the benchmark peer of bench/pods.py (not a test).

supervisord runs from its OWN virtualenv (`/tmp/pvbench-supervisord`, created with
`python3 -m venv` + `pip install supervisor` on first use, reused after), never from podvisor's.
Programs are `sleep` commands with `startsecs=0`, `autostart=true`, `autorestart=true`; the bench
talks to supervisord over XML-RPC on 127.0.0.1 (`inet_http_server`), exactly what
`supervisorctl` does. Stopped with `supervisor.shutdown()` (then SIGKILL by PID if it lingers).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import xmlrpc.client
from pathlib import Path
from typing import Any

VENV = Path(os.environ.get("PVBENCH_SUPERVISORD_VENV", "/tmp/pvbench-supervisord"))
PROGRAM = """[program:{name}]
command={command}
startsecs=0
autostart=true
autorestart=true
startretries=1000
stopsignal=KILL
stdout_logfile=NONE
stderr_logfile=NONE
"""
MAIN = """[supervisord]
logfile={dir}/supervisord.log
pidfile={dir}/supervisord.pid
nodaemon=true
loglevel=warn
minfds=4096

[inet_http_server]
port=127.0.0.1:{port}

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[include]
files = {dir}/conf.d/*.conf
"""


def ensure_venv() -> Path:
    """The supervisord executable of the bench's own virtualenv (created if missing)."""
    exe = VENV / "bin" / "supervisord"
    if not exe.exists():
        subprocess.run(["python3", "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", "supervisor"], check=True)
    return exe


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Supervisord:
    """One private supervisord: a temp dir with its config, an include dir for programs."""

    def __init__(self) -> None:
        self.exe = ensure_venv()
        self.dir = Path(tempfile.mkdtemp(prefix="pvbsd", dir="/tmp"))
        (self.dir / "conf.d").mkdir()
        self.port = free_port()
        (self.dir / "supervisord.conf").write_text(
            MAIN.format(dir=self.dir, port=self.port), encoding="utf-8")
        self.proc: subprocess.Popen[bytes] | None = None
        self.rpc: Any = xmlrpc.client.ServerProxy(f"http://127.0.0.1:{self.port}/RPC2")

    def write_programs(self, names: list[str], command: str = "sleep 3600") -> None:
        for name in names:
            (self.dir / "conf.d" / f"{name}.conf").write_text(
                PROGRAM.format(name=name, command=command), encoding="utf-8")

    def remove_programs(self) -> None:
        for path in (self.dir / "conf.d").glob("*.conf"):
            path.unlink()

    def start(self) -> float:
        """Start supervisord; returns the monotonic time just before the exec."""
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [str(self.exe), "-c", str(self.dir / "supervisord.conf")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        return t0

    def wait_rpc(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.rpc.supervisor.getState()
                return
            except (OSError, xmlrpc.client.Error):
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"supervisord exited {self.proc.returncode}") from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.005)

    def infos(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.rpc.supervisor.getAllProcessInfo()
        return result

    def wait_all_running(self, count: int, timeout: float = 120.0,
                         interval: float = 0.005) -> float:
        """Poll getAllProcessInfo until `count` programs are RUNNING; returns that time."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                infos = self.infos()
            except (OSError, xmlrpc.client.Error):
                infos = []
            if sum(1 for i in infos if i["statename"] == "RUNNING") >= count:
                return time.monotonic()
            if time.monotonic() > deadline:
                raise TimeoutError(f"supervisord: not {count} RUNNING in {timeout}s")
            time.sleep(interval)

    def update(self) -> None:
        """What `supervisorctl update` does: reloadConfig, then add/remove groups."""
        [[added, changed, removed]] = self.rpc.supervisor.reloadConfig()
        for name in removed + changed:
            self.rpc.supervisor.stopProcessGroup(name)
            self.rpc.supervisor.removeProcessGroup(name)
        for name in changed + added:
            self.rpc.supervisor.addProcessGroup(name)

    def kill9_restart(self, name: str, timeout: float = 10.0, interval: float = 0.001) -> float:
        """SIGKILL the program's process; seconds until getProcessInfo shows a new pid
        RUNNING."""
        old = self.rpc.supervisor.getProcessInfo(name)
        if old["statename"] != "RUNNING":
            raise RuntimeError(f"{name} is {old['statename']}")
        t0 = time.monotonic()
        os.kill(old["pid"], signal.SIGKILL)
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            info = self.rpc.supervisor.getProcessInfo(name)
            if info["statename"] == "RUNNING" and info["pid"] not in (0, old["pid"]):
                return time.monotonic() - t0
            time.sleep(interval)
        raise TimeoutError(f"supervisord did not restart {name}")

    def program_pids(self) -> list[int]:
        try:
            return [i["pid"] for i in self.infos() if i["pid"]]
        except (OSError, xmlrpc.client.Error):
            return []

    def stop(self) -> None:
        """XML-RPC shutdown (stops every program), SIGKILL by PID after 30 s; removes the dir."""
        if self.proc is None:
            shutil.rmtree(self.dir, ignore_errors=True)
            return
        pids = self.program_pids()
        if self.proc.poll() is None:
            try:
                self.rpc.supervisor.shutdown()
            except (OSError, xmlrpc.client.Error):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in pids:  # programs left behind (should be none)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


def spawn_floor(count: int, command: list[str]) -> float:
    """Seconds to start `count` processes directly with subprocess (each Popen returns once
    its exec succeeded); they are killed and reaped afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        t0 = time.monotonic()
        for _ in range(count):
            procs.append(subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return time.monotonic() - t0
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def supervisord_many(count: int) -> tuple[float, float]:
    """(update -> all RUNNING, cold start -> all RUNNING) for `count` programs."""
    names = [f"p{i}" for i in range(count)]
    sd = Supervisord()
    try:
        sd.start()
        sd.wait_rpc()
        sd.write_programs(names)
        t0 = time.monotonic()
        sd.update()
        update = sd.wait_all_running(count) - t0
    finally:
        sd.stop()
    sd = Supervisord()
    try:
        sd.write_programs(names)
        t0 = sd.start()
        cold = sd.wait_all_running(count) - t0
    finally:
        sd.stop()
    return update, cold
