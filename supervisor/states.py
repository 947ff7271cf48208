"""Process states of the supervisor (after supervisord's `supervisor/states.py`), as data.

The states are the control protocol's `ProcessState` (`podvisor.ipc.control`); this module
holds what only the supervisor decides: the table of allowed transitions, and `change_state()`,
the only way a supervised process changes state. Every transition is handed to a `notify`
callback (the composition root publishes it on the bus as `supervisor.process.state`).

    STOPPED  --start-->  STARTING  --ready-->  RUNNING
    STARTING/RUNNING --return 0--> EXITED   --period-->  STARTING
    STARTING/RUNNING --crash-->    BACKOFF  --delay-->   STARTING
    STARTING/RUNNING/BACKOFF --intensity exceeded--> FATAL
    STARTING/RUNNING --stop or hang--> STOPPING --exit--> STOPPED | BACKOFF | FATAL
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from podvisor.ipc.control import ProcessState

__all__ = [
    "ALIVE_STATES",
    "TRANSITIONS",
    "InvalidTransition",
    "StateChange",
    "Stateful",
    "change_state",
]

S = ProcessState

# States in which an OS process exists (or may still exist) for the supervised process.
ALIVE_STATES = frozenset({S.STARTING, S.RUNNING, S.STOPPING})

TRANSITIONS: Mapping[ProcessState, frozenset[ProcessState]] = {
    S.STOPPED: frozenset({S.STARTING}),
    S.STARTING: frozenset({S.RUNNING, S.EXITED, S.BACKOFF, S.STOPPING, S.FATAL}),
    S.RUNNING: frozenset({S.EXITED, S.BACKOFF, S.STOPPING, S.FATAL}),
    S.BACKOFF: frozenset({S.STARTING, S.STOPPED, S.FATAL}),
    S.EXITED: frozenset({S.STARTING, S.STOPPED}),
    S.STOPPING: frozenset({S.STOPPED, S.BACKOFF, S.FATAL}),
    S.FATAL: frozenset({S.STARTING, S.STOPPED}),
    S.UNKNOWN: frozenset(set(ProcessState)),
}


class InvalidTransition(RuntimeError):
    """A transition that the table does not allow: a bug in the supervisor, never user input."""


@dataclass(frozen=True)
class StateChange:
    """One transition, as published. `ts` is wall-clock time (seconds since the epoch)."""

    name: str
    from_state: ProcessState
    to_state: ProcessState
    pid: int | None
    restarts: int
    exit_code: int | None
    exit_signal: int | None
    reason: str
    ts: float


class Stateful(Protocol):
    """What `change_state` needs of a supervised process record."""

    state: ProcessState
    restarts: int
    state_since: float

    @property
    def name(self) -> str: ...

    @property
    def pid(self) -> int | None: ...

    def exit_fields(self) -> tuple[int | None, int | None, str]:
        """(exit code, exit signal, reason) of the last exit, for the published event."""
        ...


def change_state(
    proc: Stateful,
    to: ProcessState,
    notify: Callable[[StateChange], None],
    now: float,
    wall: float,
) -> StateChange:
    """Move `proc` to `to` if the table allows it, record when (`now`, monotonic), and notify.

    Raises `InvalidTransition` for an edge not in `TRANSITIONS`.
    """
    frm = proc.state
    if to not in TRANSITIONS[frm]:
        raise InvalidTransition(f"{proc.name}: {frm.name} -> {to.name} is not allowed")
    proc.state = to
    proc.state_since = now
    code, sig, reason = proc.exit_fields()
    change = StateChange(proc.name, frm, to, proc.pid, proc.restarts, code, sig, reason, wall)
    notify(change)
    return change
