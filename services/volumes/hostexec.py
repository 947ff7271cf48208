"""Commands on the node for the volume plugins (issue 24): the ``Runner`` interface (the
kubelet's ``exec.Interface``), the host's (subprocess, combined output as Go's
``CombinedOutput``), a fake for unit tests, and the kubelet's ``mount``/``umount`` calls with
their error messages (mount-utils' ``doMount``: ``mount failed: exit status 32\\nMounting
command: mount\\nMounting arguments: ...\\nOutput: ...``).

Thread-safe: the host runner holds no state; the fake takes a lock.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["FakeRunner", "HostRunner", "Ran", "Runner", "RunnerError", "mount", "unmount"]


@dataclass(frozen=True)
class Ran:
    """A finished command: ``error`` is Go's error text ('' on success): ``exit status N``,
    ``exec: "x": executable file not found in $PATH``, ``signal: killed`` (a timeout)."""

    output: str = ""
    error: str = ""
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return not self.error


class Runner(Protocol):
    def run(self, argv: Sequence[str], timeout: float = 120.0) -> Ran:
        """Run ``argv`` (no shell, no stdin) to its end or ``timeout``."""
        ...


class RunnerError(Exception):
    """A command that failed, with the kubelet's message."""


class HostRunner:
    def run(self, argv: Sequence[str], timeout: float = 120.0) -> Ran:
        try:
            done = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, timeout=timeout, check=False)
        except FileNotFoundError:
            return Ran("", f'exec: "{argv[0]}": executable file not found in $PATH')
        except PermissionError:
            return Ran("", f"fork/exec {argv[0]}: permission denied")
        except subprocess.TimeoutExpired as err:
            out = err.output.decode(errors="replace") if isinstance(err.output, bytes) else ""
            return Ran(out, "signal: killed", timed_out=True)
        out = done.stdout.decode(errors="replace")
        if done.returncode < 0:
            return Ran(out, f"signal: {_signal_name(-done.returncode)}")
        return Ran(out, f"exit status {done.returncode}" if done.returncode else "")


def _signal_name(num: int) -> str:
    import signal
    try:
        return signal.Signals(num).name.removeprefix("SIG").lower()
    except ValueError:
        return str(num)


@dataclass
class FakeRunner:
    """Records each argv; ``answer(argv)`` gives its result (default: success, no output)."""

    answer: Callable[[Sequence[str]], Ran] = lambda argv: Ran()
    calls: list[list[str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, argv: Sequence[str], timeout: float = 120.0) -> Ran:
        with self._lock:
            self.calls.append(list(argv))
        return self.answer(argv)


def mount(runner: Runner, source: str, target: str, fs_type: str,
          options: Sequence[str] = ()) -> None:
    """``mount [-t fstype] [-o opts] source target``; raises ``RunnerError`` with
    mount-utils' message."""
    args = (["-t", fs_type] if fs_type else []) + (["-o", ",".join(options)] if options
                                                   else []) + [source, target]
    ran = runner.run(["mount", *args])
    if not ran.ok:
        raise RunnerError(f"mount failed: {ran.error}\nMounting command: mount\nMounting "
                          f"arguments: {' '.join(args)}\nOutput: {ran.output}")


def unmount(runner: Runner, target: str) -> None:
    ran = runner.run(["umount", target])
    if not ran.ok:
        raise RunnerError(f"unmount failed: {ran.error}\nUnmounting arguments: {target}\n"
                          f"Output: {ran.output}")
