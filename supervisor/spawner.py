"""Spawning supervised processes: the `Spawner` interface, the real fork-exec one, and a fake.

The real spawner runs `python -m podvisor.supervisor.child NAME` with `subprocess.Popen`
(vfork+exec, fds closed, stdin from /dev/null, stdout/stderr inherited) and opens a pidfd for it.
The pidfd becomes readable the moment the child exits, so the supervisor's poller learns of a
death at once; signals go through `pidfd_send_signal`, so they can never hit a recycled pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from podvisor.supervisor.registry import ProcessSpec

__all__ = ["ChildHandle", "ExitStatus", "FakeHandle", "FakeSpawner", "Spawner", "new_spawner"]


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


def new_spawner(python: str = sys.executable) -> Spawner:
    """The real fork-exec spawner."""
    return _ExecSpawner(python)


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

    def last(self, name: str) -> FakeHandle:
        return [h for n, h in self.spawned if n == name][-1]
