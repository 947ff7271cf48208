"""The zygote: a small pre-started, single-threaded process that forks container monitors.

Forking a monitor straight from the runtime would fork a multi-threaded gRPC process; starting a
fresh Python per container would cost tens of milliseconds. So the runtime starts this helper once
(``python -m podvisor.services.runtime.zygote FD``) and asks it over a SOCK_SEQPACKET socketpair:
one message per start, ``{"dir": <container state dir>}`` plus two fds (SCM_RIGHTS): the write end
of a reply pipe and the opened log file (or none). The zygote keeps one *spare* monitor forked
and warmed up in advance; it reads the container's spec.json, hands spec + fds to the spare (which
becomes the container's monitor, ``monitor.run_monitor``, and answers on the reply pipe), and
forks the next spare once it is idle again. The zygote ignores SIGCHLD, so finished monitors
are reaped by the kernel; it exits when the runtime closes its end (runtime gone), and
the monitors, in their own sessions, live on.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import NoReturn

from podvisor.services.runtime.monitor import run_monitor, warm_up

_MAX_MSG = 64 * 1024
_SPARES = 2  # monitors kept forked and warm
_REFILL_IDLE = 0.003  # seconds without requests before forking a spare


@dataclass(frozen=True)
class SpawnResult:
    ok: bool
    error: str = ""
    monitor_pid: int = 0
    monitor_ticks: int = 0
    pid: int = 0
    pid_ticks: int = 0
    started_at: int = 0


class SpawnError(Exception):
    """The zygote or the monitor failed (not the container's exec: that is SpawnResult.error)."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _spare_main(conn: socket.socket) -> NoReturn:
    """A pre-forked monitor waiting for its container: header (8-byte length) + fds, then the
    JSON request. EOF (the zygote exited) means: never used, just exit."""
    code = 0
    try:
        my_ticks = warm_up()
        header, fds, _flags, _addr = socket.recv_fds(conn, 8, 4)
        if len(header) < 8:
            raise EOFError
        header += _recv_exact(conn, 8 - len(header)) if len(header) < 8 else b""
        body = _recv_exact(conn, struct.unpack("!Q", header)[0])
        conn.close()
        req = json.loads(body)
        reply_fd = fds[0] if fds else -1
        log_fd = fds[1] if len(fds) > 1 else -1
        run_monitor(req["dir"], req["spec"], reply_fd, log_fd, my_ticks)
    except (EOFError, OSError):
        code = 0
    except BaseException:
        code = 70
    os._exit(code)


class _Zygote:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.spares: list[socket.socket] = []

    def fork_spare(self) -> None:
        gc.collect()
        gc.freeze()  # keep the collector from touching (copying) inherited objects
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.fork() == 0:
            keep = theirs.fileno()  # drop every other fd: the runtime socket, other spares and
            os.closerange(3, keep)  # fds of a request being handed over right now
            os.closerange(keep + 1, 1 << 20)
            _spare_main(theirs)
        theirs.close()
        self.spares.append(ours)

    def hand_over(self, state_dir: str, fds: list[int]) -> None:
        try:
            with open(os.path.join(state_dir, "spec.json"), "rb") as f:
                raw_spec = f.read()
        except OSError as err:
            if fds:
                os.write(fds[0], json.dumps({"ok": False, "error": f"no spec: {err}"}).encode())
            return
        body = b'{"dir": %s, "spec": %s}' % (json.dumps(state_dir).encode(), raw_spec)
        for _attempt in range(2):
            if not self.spares:
                self.fork_spare()
            spare = self.spares.pop(0)
            try:
                socket.send_fds(spare, [struct.pack("!Q", len(body))], fds)
                spare.sendall(body)
                spare.close()
                return
            except OSError:
                spare.close()  # the spare died: use (or fork) another, once


def serve(sock: socket.socket) -> None:
    """The zygote's loop. Runs until the runtime closes its end of ``sock``.

    Spares are refilled only after ``_REFILL_IDLE`` seconds without a request, so the fork does
    not compete for the CPU with a monitor that is starting its container.
    """
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    zygote = _Zygote(sock)
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    while True:
        if len(zygote.spares) < _SPARES and not poller.poll(_REFILL_IDLE * 1000):
            zygote.fork_spare()
            continue
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
            state_dir = ""
        if state_dir:
            zygote.hand_over(state_dir, fds)
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
    reply = None
    while reply is None:
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            raise SpawnError(f"container monitor did not answer within {timeout} s")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise SpawnError("container monitor exited before starting the container "
                             f"(see monitor.err); partial reply {data[:200]!r}")
        data += chunk
        try:
            reply = json.loads(data)
        except ValueError:
            continue  # more to come
    if reply.get("ok"):
        return SpawnResult(True, "", int(reply["monitor_pid"]), int(reply["monitor_ticks"]),
                           int(reply["pid"]), int(reply["pid_ticks"]), int(reply["started_at"]))
    return SpawnResult(ok=False, error=str(reply.get("error", "unknown error")))


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    serve(sock)


if __name__ == "__main__":
    main()
