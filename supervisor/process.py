"""The supervisor's record of one supervised process (mutable; owned by the loop thread)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from podvisor.ipc.control import LastExit, ProcessRow, ProcessState
from podvisor.supervisor.policy import History
from podvisor.supervisor.registry import ProcessSpec
from podvisor.supervisor.spawner import ChildHandle
from podvisor.supervisor.states import ALIVE_STATES

__all__ = ["Intent", "SupervisedProcess"]


class Intent(enum.Enum):
    """Why a process is being stopped, which decides what happens when it exits."""

    NONE = "NONE"
    STOP = "STOP"  # operator stop or disabled by reload: stay STOPPED
    RESTART = "RESTART"  # operator restart: start again at once
    HUNG = "HUNG"  # missed heartbeats: counts as a crash
    REMOVE = "REMOVE"  # removed from the config by reload: forget it once stopped
    SHUTDOWN = "SHUTDOWN"  # agent shutdown: stay STOPPED


@dataclass
class SupervisedProcess:
    spec: ProcessSpec
    state: ProcessState = ProcessState.STOPPED
    handle: ChildHandle | None = None
    restarts: int = 0
    state_since: float = 0.0
    started_at: float = 0.0
    last_beat: float = 0.0
    last_exit: LastExit | None = None
    history: History = field(default_factory=History)
    intent: Intent = Intent.NONE
    due_at: float | None = None  # respawn time (EXITED/BACKOFF) or SIGKILL time (STOPPING)
    reason: str = ""  # why the last transition happened (published with it)
    last_pid: int | None = None  # the pid of the latest incarnation, even after it exited
    late: bool = False  # RUNNING, and no heartbeat for ``late_after``
    # this incarnation is late after this long without a beat (the core's ``late_after()`` when
    # it was spawned: the heartbeat interval it read at its start); None: never
    late_after: float | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int | None:
        """The pid of the latest incarnation (published with state changes)."""
        return self.handle.pid if self.handle is not None else self.last_pid

    @property
    def alive(self) -> bool:
        return self.state in ALIVE_STATES

    def exit_fields(self) -> tuple[int | None, int | None, str]:
        if self.last_exit is None:
            return None, None, self.reason
        return self.last_exit.code, self.last_exit.signal, self.reason

    def status(self, now: float, wall: float) -> ProcessRow:
        """The `status` row of this process (`now` monotonic, `wall` its wall-clock time)."""
        running = self.state == ProcessState.RUNNING
        return ProcessRow(
            name=self.name,
            state=self.state,
            pid=self.handle.pid if self.handle is not None else None,
            restarts=self.restarts,
            uptime=round(now - self.started_at, 3) if running else None,
            heartbeat_age=round(now - self.last_beat, 3) if running else None,
            heartbeat_late=self.late,
            since=round(wall - (now - self.state_since), 3),
            module=self.spec.module,
            enabled=self.spec.enabled,
            reason=self.reason,
            last_exit=self.last_exit,
        )
