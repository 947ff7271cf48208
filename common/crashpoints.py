"""Crash points: a process that SIGKILLs itself at a named step, for fault-injection tests.

A test arms steps through the environment of the agent (the supervisor, the fork server and
every child inherit it):

    PODVISOR_CRASH_AT="runtime:start.after_send,syncloop:sync.after_create"
    PODVISOR_CRASH_ONCE_DIR=/tmp/x        (optional; see below)

Each entry is ``<process>:<step>``; a process builds its ``CrashPoints`` with its own name
(``from_env("runtime")``) and calls ``hit("start.after_send")`` at that step of its work. An
armed step kills the process with SIGKILL on the spot: no ``finally``, no atexit, no flush, the
same as ``kill -9`` from outside, but at an exact point of the code instead of a random one.
With ``PODVISOR_CRASH_ONCE_DIR`` each step fires once for all the processes that share the
directory: the first hit creates ``<process>.<step>`` there (O_EXCL, so two threads or a
restarted process cannot both fire) and the process restarted by the supervisor passes the step.
Without it a step fires on every hit.

Unarmed (the normal case) ``hit`` is one set lookup. The steps of each process are listed where
it calls ``hit`` (``STEPS`` of the runtime's engine, the sync loop's syncpod) and in
docs/ARCHITECTURE.md ("Exactly once").
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

ENV_AT = "PODVISOR_CRASH_AT"
ENV_ONCE_DIR = "PODVISOR_CRASH_ONCE_DIR"


class CrashPoints:
    """Thread-safe: ``hit`` reads immutable state; the once-file is the only shared effect."""

    def __init__(self, process: str, armed: frozenset[str] = frozenset(),
                 once_dir: str = "") -> None:
        self.process = process
        self.armed = armed
        self.once_dir = once_dir

    def hit(self, step: str) -> None:
        """SIGKILL this process when ``step`` is armed (and, with a once-dir, not fired yet)."""
        if step not in self.armed:
            return
        if self.once_dir:
            try:
                fd = os.open(os.path.join(self.once_dir, f"{self.process}.{step}"),
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                return
            except OSError:
                return  # an unusable directory disarms the step rather than firing forever
            os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)


NEVER = CrashPoints("", frozenset())


def parse(process: str, value: str) -> frozenset[str]:
    """The steps armed for ``process`` in a ``PODVISOR_CRASH_AT`` value."""
    steps = set()
    for entry in value.split(","):
        name, sep, step = entry.strip().partition(":")
        if sep and name == process and step:
            steps.add(step)
    return frozenset(steps)


def from_env(process: str, env: Mapping[str, str] | None = None) -> CrashPoints:
    env = os.environ if env is None else env
    armed = parse(process, env.get(ENV_AT, ""))
    if not armed:
        return NEVER
    return CrashPoints(process, armed, env.get(ENV_ONCE_DIR, ""))
