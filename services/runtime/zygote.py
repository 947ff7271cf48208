"""The zygote: a small pre-started, single-threaded process that forks container monitors.

Forking a monitor straight from the runtime would fork a multi-threaded gRPC process; starting a
fresh Python per container would cost tens of milliseconds. So the runtime starts this helper once
(``python -m podvisor.services.runtime.zygote FD``) and asks it over a SOCK_SEQPACKET socketpair:
one message per start, ``{"dir": <container state dir>}`` plus two fds (SCM_RIGHTS): the write end
of a reply pipe and the opened log file (or none). The zygote forks; the child becomes the monitor
(``monitor.run_monitor``) and answers on the reply pipe. The zygote ignores SIGCHLD, so finished
monitors are reaped by the kernel; it exits when the runtime closes its end (runtime gone), and
the monitors, in their own sessions, live on.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass

from podvisor.services.runtime.monitor import run_monitor

_MAX_MSG = 64 * 1024


@dataclass(frozen=True)
class SpawnResult:
    ok: bool
    pid: int = 0
    error: str = ""


class SpawnError(Exception):
    """The zygote or the monitor failed (not the container's exec: that is SpawnResult.error)."""


def serve(sock: socket.socket) -> None:
    """The zygote's loop. Runs until the runtime closes its end of ``sock``."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MSG, 4)
        except InterruptedError:
            continue
        except OSError:
            return
        if not msg:
            return
        try:
            state_dir = str(json.loads(msg)["dir"])
        except (ValueError, KeyError, TypeError):
            for fd in fds:
                os.close(fd)
            continue
        reply_fd = fds[0] if fds else -1
        log_fd = fds[1] if len(fds) > 1 else -1
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                run_monitor(state_dir, reply_fd, log_fd)
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)


class Spawner:
    """The runtime's side: starts the zygote lazily and asks it for monitors. Thread-safe."""

    def __init__(self, reply_timeout: float = 10.0) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._reply_timeout = reply_timeout

    def start(self) -> None:
        with self._lock:
            self._ensure()

    def _ensure(self) -> socket.socket:
        if self._sock is not None and self._proc is not None and self._proc.poll() is None:
            return self._sock
        self._close_locked()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "podvisor.services.runtime.zygote", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, start_new_session=True,
        )
        theirs.close()
        self._sock = ours
        return ours

    def spawn(self, state_dir: str, log_fd: int) -> SpawnResult:
        """Fork a monitor for the container in ``state_dir``; wait for exec success or failure."""
        reply_r, reply_w = os.pipe2(os.O_CLOEXEC)
        try:
            fds = [reply_w] + ([log_fd] if log_fd >= 0 else [])
            msg = json.dumps({"dir": state_dir}).encode()
            with self._lock:
                try:
                    socket.send_fds(self._ensure(), [msg], fds)
                except OSError:
                    self._close_locked()  # the zygote died: start a new one, once
                    socket.send_fds(self._ensure(), [msg], fds)
            os.close(reply_w)
            reply_w = -1
            return _read_reply(reply_r, self._reply_timeout)
        finally:
            os.close(reply_r)
            if reply_w >= 0:
                os.close(reply_w)

    def _close_locked(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def close(self) -> None:
        """Close the socket; the zygote sees EOF and exits (monitors are not affected)."""
        with self._lock:
            self._close_locked()


def _read_reply(fd: int, timeout: float) -> SpawnResult:
    data = b""
    while True:
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            raise SpawnError(f"container monitor did not answer within {timeout} s")
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    if not data:
        raise SpawnError("container monitor exited before starting the container (see monitor.err)")
    reply = json.loads(data)
    if reply.get("ok"):
        return SpawnResult(ok=True, pid=int(reply["pid"]))
    return SpawnResult(ok=False, error=str(reply.get("error", "unknown error")))


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    serve(sock)


if __name__ == "__main__":
    main()
