"""Spawning supervised processes: the `Spawner` interface, two real ones, and a fake.

Forkserver (the default, `supervision.spawnMethod: forkserver`): podvisor's fork server
(`forkserver.py`), started once with the harness and every service module preloaded, forks each
child; a restart costs a fork, not a Python start-up plus imports (~200 ms here), so a killed
process is back in a few ms. The child's death is seen through its status pipe (readable once
the server has reaped it and written its exit code). The server exits when the supervisor does;
its children then get their parent-death signal. Blind spot: killing the server itself kills
every child (they are its children); the supervisor then restarts them all through a new one.

Exec (`spawnMethod: exec`): runs `python -m podvisor.supervisor.child NAME` with `subprocess.Popen`
(vfork+exec, fds closed, stdin from /dev/null, stdout/stderr inherited) and opens a pidfd for it.
The pidfd becomes readable the moment the child exits, so the supervisor's poller learns of a
death at once; signals go through `pidfd_send_signal`, so they can never hit a recycled pid.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from podvisor.supervisor.forkserver import ORPHANED, ForkServer, read_status
from podvisor.supervisor.registry import ProcessSpec

__all__ = [
    "ChildHandle",
    "ExitStatus",
    "FakeHandle",
    "FakeSpawner",
    "Spawner",
    "new_forkserver_spawner",
    "new_spawner",
]


@dataclass(frozen=True)
class ExitStatus:
    """How a child ended: `code` for a normal exit, `signal` when a signal killed it."""

    code: int | None
    signal: int | None

    @property
    def clean(self) -> bool:
        return self.code == 0 and self.signal is None

    def describe(self) -> str:
        if self.signal is not None:
            try:
                return f"killed by {signal.Signals(self.signal).name}"
            except ValueError:
                return f"killed by signal {self.signal}"
        return "exited normally" if self.code == 0 else f"exit code {self.code}"


class ChildHandle(Protocol):
    """One spawned OS process. Used from the supervisor's loop thread only."""

    pid: int

    def fileno(self) -> int:
        """An fd that becomes readable when the process exits (a pidfd)."""
        ...

    def poll(self) -> ExitStatus | None:
        """Reap without blocking: the exit status, or None while it still runs."""
        ...

    def send_signal(self, sig: int) -> bool:
        """Deliver `sig`; False when the process is already gone."""
        ...

    def close(self) -> None:
        """Release the fd (after the process was reaped)."""
        ...


class Spawner(Protocol):
    def spawn(self, spec: ProcessSpec, env: Mapping[str, str]) -> ChildHandle:
        """Start `spec` as a child process with `env` added to the environment (raises OSError)."""
        ...

    def close(self) -> None:
        """Release what the spawner keeps (the fork server), once its children are gone."""
        ...


class _PopenHandle:
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        self.pid = proc.pid
        self._fd = os.pidfd_open(proc.pid)

    def fileno(self) -> int:
        return self._fd

    def poll(self) -> ExitStatus | None:
        rc = self._proc.poll()
        if rc is None:
            return None
        return ExitStatus(None, -rc) if rc < 0 else ExitStatus(rc, None)

    def send_signal(self, sig: int) -> bool:
        if self._fd < 0:
            return False
        try:
            signal.pidfd_send_signal(self._fd, sig)
        except ProcessLookupError:
            return False
        return True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _ExecSpawner:
    def __init__(self, python: str) -> None:
        self._python = python

    def spawn(self, spec: ProcessSpec, env: Mapping[str, str]) -> ChildHandle:
        proc = subprocess.Popen(
            [self._python, "-m", "podvisor.supervisor.child", spec.name],
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            close_fds=True,
        )
        try:
            return _PopenHandle(proc)
        except OSError:
            proc.kill()
            proc.wait()
            raise

    def close(self) -> None:
        pass


def new_spawner(python: str = sys.executable) -> Spawner:
    """The real fork-exec spawner."""
    return _ExecSpawner(python)


def _readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


class _ForkHandle:
    """A child of the fork server: its status pipe (readable once the server has reaped it and
    written the exit code) and a pidfd for signals. When the pipe ends without a code (the
    server died: the child got its parent-death signal and is stopping), the pidfd stands in:
    the child counts as exited only once it really has, so its replacement never runs beside
    it (two runtimes on one state directory would each see the other's containers die)."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self._status_fd = status_fd
        self._status: ExitStatus | None = None
        self._orphaned = False
        try:
            self._pidfd = os.pidfd_open(pid)
        except OSError:  # already gone (and reaped by the fork server)
            self._pidfd = -1

    def fileno(self) -> int:
        return self._pidfd if self._orphaned and self._pidfd >= 0 else self._status_fd

    def poll(self) -> ExitStatus | None:
        if self._status is not None or self._status_fd < 0:
            return self._status
        if not self._orphaned:
            try:
                rc = read_status(self._status_fd)
            except EOFError:
                self._orphaned = True
            else:
                if rc is not None:
                    self._status = ExitStatus(None, -rc) if rc < 0 else ExitStatus(rc, None)
                return self._status
        if self._pidfd < 0 or _readable(self._pidfd):
            self._status = ExitStatus(ORPHANED, None)  # its code went with the server
        return self._status

    def send_signal(self, sig: int) -> bool:
        if self._pidfd < 0:
            return False
        try:
            signal.pidfd_send_signal(self._pidfd, sig)
        except ProcessLookupError:
            return False
        return True

    def close(self) -> None:
        for attr in ("_pidfd", "_status_fd"):
            fd = getattr(self, attr)
            if fd >= 0:
                os.close(fd)
                setattr(self, attr, -1)


class _ForkserverSpawner:
    def __init__(self, preload: Sequence[str]) -> None:
        self._server = ForkServer(["podvisor.supervisor.child", *preload])

    def spawn(self, spec: ProcessSpec, env: Mapping[str, str]) -> ChildHandle:
        pid, status_fd = self._server.fork(spec.name, env)
        return _ForkHandle(pid, status_fd)

    def close(self) -> None:
        self._server.close()


def new_forkserver_spawner(preload: Sequence[str] = ()) -> Spawner:
    """The fork server spawner (supervisor/forkserver.py); `preload` names modules the server
    imports once."""
    return _ForkserverSpawner(preload)


@dataclass
class FakeHandle:
    """A fake child: `exit(status)` makes `fileno()` readable and `poll()` return `status`."""

    pid: int
    signals: list[int] = field(default_factory=list)
    status: ExitStatus | None = None
    _pipe: tuple[int, int] = field(default_factory=os.pipe)

    def fileno(self) -> int:
        return self._pipe[0]

    def poll(self) -> ExitStatus | None:
        return self.status

    def send_signal(self, sig: int) -> bool:
        self.signals.append(sig)
        return self.status is None

    def exit(self, status: ExitStatus) -> None:
        self.status = status
        os.write(self._pipe[1], b"x")

    def close(self) -> None:
        for fd in self._pipe:
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass
class FakeSpawner:
    """Records spawns; `fail_next` makes the next spawn raise OSError (a knob for errors)."""

    spawned: list[tuple[str, FakeHandle]] = field(default_factory=list)
    fail_next: int = 0
    next_pid: int = 1000

    def spawn(self, spec: ProcessSpec, env: Mapping[str, str]) -> ChildHandle:
        if self.fail_next > 0:
            self.fail_next -= 1
            raise OSError(12, "fake spawn failure")
        self.next_pid += 1
        handle = FakeHandle(self.next_pid)
        self.spawned.append((spec.name, handle))
        return handle

    def close(self) -> None:
        pass

    def last(self, name: str) -> FakeHandle:
        return [h for n, h in self.spawned if n == name][-1]
