"""The one clock interface, and the only module that reads the machine's clocks.

It lives in ``ipc`` (the bottom layer) because the map owners and replicas need it;
``podvisor.common`` re-exports it for everyone else.

Three readings: ``monotonic()`` (seconds, CLOCK_MONOTONIC: deadlines, intervals, timers, poll
timeouts), ``wall()`` (seconds since the epoch: timestamps shown to users or written into
statuses and events). A process builds ONE clock at its edge (``SYSTEM_CLOCK``, or a
``FakeClock`` in a test) and hands it to everything that computes a deadline: the service loop,
the map owners and replicas, the publishers. No object takes a clock of its own by default, so a
fake clock and the real one are never mixed in one object graph (a fake monotonic at 1000.0
beside a real one that reads the machine's uptime was issue 10's fresh-boot bug).

``SystemClock`` looks ``time.monotonic``/``time.time`` up at each call, so a test that shifts
``time.monotonic`` (tests/conftest.py's fresh-boot guard) shifts every real clock in the process.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["SYSTEM_CLOCK", "Clock", "FakeClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (only differences mean anything)."""
        ...

    def wall(self) -> float:
        """Seconds since the Unix epoch (may jump: never use it for deadlines)."""
        ...

    def wall_ns(self) -> int:
        """``wall`` in integer nanoseconds (CRI timestamps)."""
        ...


class SystemClock:
    """The machine's clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def wall_ns(self) -> int:
        return time.time_ns()

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()


class FakeClock:
    """A clock a test moves by hand: ``now`` (monotonic) and ``wall_now``; ``advance(s)`` moves
    both. Also callable (returns ``now``) for code that takes a monotonic function."""

    def __init__(self, now: float = 1000.0, wall: float = 1_700_000_000.0) -> None:
        self.now = now
        self.wall_now = wall

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.wall_now

    def wall_ns(self) -> int:
        return int(self.wall_now * 1_000_000_000)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall_now += seconds

    def __call__(self) -> float:
        return self.now

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now}, wall={self.wall_now})"
