"""``FakeClock``, the one fake clock of the tests: a faithful monotonic clock moved by hand
(``advance`` moves both readings, assigning ``now`` the monotonic one alone, neither ever goes
back), callable as a monotonic function, and a ``Clock``."""

from __future__ import annotations

import pytest

from podvisor.ipc.clock import Clock, FakeClock


def test_advance_moves_both_readings() -> None:
    clock = FakeClock(100.0, 1_700_000_000.0)
    assert isinstance(clock, Clock)
    clock.advance(2.5)
    assert (clock.monotonic(), clock(), clock.now) == (102.5, 102.5, 102.5)
    assert clock.wall() == 1_700_000_002.5
    assert clock.wall_ns() == 1_700_000_002_500_000_000


def test_assigning_now_moves_the_monotonic_reading_alone() -> None:
    clock = FakeClock(0.0, wall=0.0)
    clock.now = 101.0
    clock.now += 2
    clock.now = 103.0  # the same point again is no step back
    assert (clock(), clock.wall()) == (103.0, 0.0)


def test_it_never_goes_back() -> None:
    clock = FakeClock(100.0)
    with pytest.raises(ValueError, match="never goes back"):
        clock.now = 99.0
    with pytest.raises(ValueError, match="never goes back"):
        clock.now -= 1
    with pytest.raises(ValueError, match="never goes back"):
        clock.advance(-0.5)
    assert clock() == 100.0


def test_the_wall_clock_may_jump() -> None:
    clock = FakeClock(100.0, wall=1000.0)
    clock.wall_now = 10.0  # a wall clock stepped back (NTP): allowed, monotonic untouched
    assert (clock.wall(), clock()) == (10.0, 100.0)
