"""podvisor's fork server: one preloaded interpreter that forks every supervised process.

Started by the supervisor as ``python -m podvisor.supervisor.forkserver FD MODULE...`` with one
end of a ``SOCK_SEQPACKET`` socket pair as FD. It imports the harness and every service module
once, freezes what they made (``gc.freeze()``: a child's collections then never write to, and
so never copy, the pages it shares with the server), says ``ready`` and serves requests, one
message each way:

- request: JSON ``{"name": NAME, "env": {...}}``;
- answer: JSON ``{"pid": PID}`` with the read end of the child's status pipe passed as
  SCM_RIGHTS, or ``{"error": TEXT}``.

When it reaps a child (SIGCHLD, through the wake-up fd of its one poll loop) it writes the
child's exit code to that pipe (4 bytes, native int, negative: killed by that signal) and
closes it: the supervisor's end becomes readable then (``ChildHandle.fileno()``), and reads EOF
without a code when the server itself died. The child runs ``child.forked_main`` with every fd
of the server closed.

Why not ``multiprocessing``'s forkserver (the first version): that one runs a resource-tracker
process beside it and starts each child by unpickling its target and re-running the agent's
``__main__`` (``runpy``), ~3 MB of private memory per child before the child's own code runs;
here a child starts right after the fork (measured with bench/pods.py's idle stage).

Lifetime: the server exits when the supervisor's end closes (EOF) and, through
PR_SET_PDEATHSIG, when the supervisor dies; its children then get their own parent-death
signal. SIGINT is ignored (a terminal's Ctrl-C is the supervisor's to handle).
"""

from __future__ import annotations

import array
import contextlib
import gc
import importlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence

__all__ = ["ForkServer", "ForkServerError", "main"]

MAX_MESSAGE = 1 << 20
STATUS = struct.Struct("i")
READY = b"ready"
FORK_TIMEOUT = 10.0
ORPHANED = 255  # the exit code of a child whose server died first (its code went with it)


class ForkServerError(OSError):
    """The server could not be started or did not answer."""


# --- the server (its own process) ---------------------------------------------------------------

def _reap(status_fds: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = status_fds.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.write(fd, STATUS.pack(os.waitstatus_to_exitcode(status)))
            os.close(fd)


def _child(name: str, env: Mapping[str, str], close: Sequence[int]) -> None:
    """In the forked child: drop the server's fds and handlers, run the harness, never return."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        for fd in close:
            with contextlib.suppress(OSError):
                os.close(fd)
        from podvisor.supervisor.child import forked_main

        forked_main(name, dict(env))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        # As a started interpreter would at exit: wait for non-daemon threads (a thread pool's
        # workers finishing their item), then flush; os._exit skips the server's own cleanup.
        with contextlib.suppress(BaseException):
            threading._shutdown()  # type: ignore[attr-defined]
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)


def _serve(sock: socket.socket) -> None:
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)
    status_fds: dict[int, int] = {}  # child pid -> write end of its status pipe
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    sock.send(READY)
    while True:
        for fd, _events in poller.poll():
            if fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                _reap(status_fds)
                continue
            data = sock.recv(MAX_MESSAGE)
            if not data:
                return  # the supervisor closed its end
            try:
                request = json.loads(data)
                name, env = str(request["name"]), dict(request["env"])
            except (ValueError, KeyError, TypeError) as exc:
                sock.send(json.dumps({"error": f"bad request: {exc}"}).encode())
                continue
            read_end, write_end = os.pipe2(os.O_CLOEXEC)
            try:
                pid = os.fork()
            except OSError as exc:
                os.close(read_end)
                os.close(write_end)
                sock.send(json.dumps({"error": f"fork: {exc}"}).encode())
                continue
            if pid == 0:
                _child(name, env, [sock.fileno(), wake_r, wake_w, read_end, write_end,
                                   *status_fds.values()])
            status_fds[pid] = write_end
            try:
                sock.sendmsg([json.dumps({"pid": pid}).encode()],
                           [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [read_end]))])
            finally:
                os.close(read_end)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    from podvisor.supervisor.child import set_parent_death_signal

    set_parent_death_signal(signal.SIGTERM)
    supervisor = os.environ.get("PODVISOR_SUPERVISOR_PID")
    if supervisor and os.getppid() != int(supervisor):
        return 3  # the supervisor died before the death signal was armed
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=int(args[0]))
    for module in args[1:]:
        # a module that fails here fails again in its child, which reports it
        # (child.import_failed)
        with contextlib.suppress(Exception):
            importlib.import_module(module)
    gc.collect()
    gc.freeze()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        _serve(sock)
    return 0


# --- the supervisor's side ----------------------------------------------------------------------

class ForkServer:
    """The supervisor's link to its fork server (started on first use, and again after it
    died). Used from the supervisor's loop thread only."""

    def __init__(self, preload: Sequence[str], python: str = sys.executable,
                 timeout: float = 120.0) -> None:
        self._preload = list(preload)
        self._python = python
        self._timeout = timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None

    def _start(self) -> socket.socket:
        self.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self._proc = subprocess.Popen(
                [self._python, "-B", "-m", "podvisor.supervisor.forkserver",
                 str(theirs.fileno()), *self._preload],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                env={**os.environ, "PODVISOR_SUPERVISOR_PID": str(os.getpid())})
        ours.settimeout(self._timeout)  # the preload: imports every service module once
        try:
            hello = ours.recv(len(READY))
        except OSError as exc:
            ours.close()
            raise ForkServerError(f"fork server did not start: {exc}") from exc
        if hello != READY:
            ours.close()
            raise ForkServerError(f"fork server did not start (exit {self._proc.wait()})")
        # a fork takes milliseconds: a server that does not answer within this (stopped,
        # hung) is replaced rather than holding the supervisor's loop
        ours.settimeout(FORK_TIMEOUT)
        self._sock = ours
        return ours

    def fork(self, name: str, env: Mapping[str, str]) -> tuple[int, int]:
        """Start child ``name``; returns (pid, status fd). A server found dead is started again
        once."""
        request = json.dumps({"name": name, "env": dict(env)}).encode()
        for attempt in (1, 2):
            sock = self._sock
            if sock is None or (self._proc is not None and self._proc.poll() is not None):
                sock = self._start()
            try:
                sock.send(request)
                data, fds = _recv_fds(sock)
            except OSError as exc:
                if attempt == 2:
                    raise ForkServerError(f"fork server failed: {exc}") from exc
                self.close()
                continue
            if not data:
                if attempt == 2:
                    raise ForkServerError("fork server closed the connection")
                self.close()
                continue
            try:
                answer = dict(json.loads(data))
            except (ValueError, TypeError):
                answer = {"error": f"unreadable answer {data[:80]!r}"}
            if "error" in answer or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                raise ForkServerError(f"fork server: {answer.get('error', 'no status fd')}")
            os.set_inheritable(fds[0], False)  # (SCM_RIGHTS does not carry O_CLOEXEC)
            os.set_blocking(fds[0], False)
            return int(answer["pid"]), fds[0]
        raise ForkServerError("unreachable")

    def close(self) -> None:
        """Close our end (the server exits on EOF) and reap it."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


def _recv_fds(sock: socket.socket) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    data, ancdata, _flags, _addr = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def read_status(fd: int) -> int | None:
    """The exit code written to a status pipe: None while nothing is there; raises EOFError when
    the pipe ended without one (the server died before reaping the child)."""
    try:
        data = os.read(fd, STATUS.size)
    except BlockingIOError:
        return None
    if len(data) < STATUS.size:
        raise EOFError("the fork server ended before it reaped the child")
    return int(STATUS.unpack(data)[0])


if __name__ == "__main__":
    sys.exit(main())
