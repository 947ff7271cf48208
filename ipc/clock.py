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
    """A clock a test moves by hand (the one fake clock: tests build no clock of their own).

    ``now`` is the monotonic reading and ``wall_now`` the wall one. ``advance(s)`` moves both by
    ``s``; assigning ``now`` (``clock.now = 101.0``, ``clock.now += 2``) moves the monotonic
    reading alone, to a point in time. Either way it never goes back: a step backwards raises
    ``ValueError``, as a monotonic clock cannot show it. ``wall_now`` may be set to anything (a
    wall clock may jump). Also callable (returns ``now``) for code that takes a monotonic
    function; pass ``clock.wall`` for one that takes a wall-clock function."""

    def __init__(self, now: float = 1000.0, wall: float = 1_700_000_000.0) -> None:
        self._now = now
        self.wall_now = wall

    @property
    def now(self) -> float:
        return self._now

    @now.setter
    def now(self, value: float) -> None:
        if value < self._now:
            raise ValueError(f"a monotonic clock never goes back: {value} < {self._now}")
        self._now = value

    def monotonic(self) -> float:
        return self._now

    def wall(self) -> float:
        return self.wall_now

    def wall_ns(self) -> int:
        return int(self.wall_now * 1_000_000_000)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a monotonic clock never goes back: advance({seconds})")
        self._now += seconds
        self.wall_now += seconds

    def __call__(self) -> float:
        return self._now

    def __repr__(self) -> str:
        return f"FakeClock(now={self._now}, wall={self.wall_now})"
