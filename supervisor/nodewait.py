"""The supervisor's side of graceful node shutdown (issue 27; the work is the ``nodeshutdown``
process's, services/nodeshutdown/): ask with ``NodeShutdown`` (again every ``ASK_EVERY`` until
answered: the bus may drop it, and a ``nodeshutdown`` restarted mid-drain needs asking again),
and say when the agent stops: on ``NodeShutdownDone``, asked for or not (logind's
PrepareForShutdown), or once the groups' seconds plus ``SLACK`` have passed since asking."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from podvisor.ipc.messages import Message, NodeShutdown

__all__ = ["ASK_EVERY", "SLACK", "NodeShutdownWait"]

ASK_EVERY = 1.0
SLACK = 15.0  # past the groups' seconds: the statuses, the Node, the answer


@dataclass
class NodeShutdownWait:
    """State of one agent's node shutdown request; the loop's thread only."""

    publish: Callable[[Message], object]
    clock: Callable[[], float]  # monotonic
    wall: Callable[[], float]
    deadline: float | None = None  # asked, waiting until then
    asked: float = 0.0
    answered: bool = False  # NodeShutdownDone came
    timed_out: bool = False

    @property
    def waiting(self) -> bool:
        return self.deadline is not None

    def ask(self, seconds: float) -> None:
        """Ask for a drain of at most ``seconds`` (the groups' sum)."""
        self.deadline = self.clock() + seconds + SLACK
        self._publish()

    def _publish(self) -> None:
        self.asked = self.clock()
        self.publish(NodeShutdown(reason="agent shutdown", ts=self.wall()))

    def due(self) -> bool:
        """Whether the agent stops now (answered, or the wait ran out); asks again when due."""
        if self.answered:
            return True
        if self.deadline is None:
            return False
        now = self.clock()
        if now >= self.deadline:
            self.timed_out = True
            return True
        if now >= self.asked + ASK_EVERY:
            self._publish()
        return False

    def next_deadline(self) -> float | None:
        return None if self.deadline is None else min(self.deadline, self.asked + ASK_EVERY)
