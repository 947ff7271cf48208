"""Restart policy: pure decisions with an injected clock."""

from __future__ import annotations

import pytest

from podvisor.supervisor.policy import Action, History, backoff_delay, on_crash, on_normal_exit
from podvisor.supervisor.registry import ProcessSpec


def spec(**kw: object) -> ProcessSpec:
    base: dict[str, object] = {"name": "p", "module": "m", "period": 2.0, "jitter": 0.0,
                               "backoff_base": 0.1, "backoff_cap": 1.0,
                               "backoff_reset_after": 10.0, "intensity": 5,
                               "intensity_period": 60.0}
    base.update(kw)
    return ProcessSpec(**base)  # type: ignore[arg-type]


def test_normal_exit_waits_period_plus_jitter() -> None:
    s = spec(period=2.0, jitter=0.5)
    assert on_normal_exit(s, History(), 0.0).delay == 2.0
    assert on_normal_exit(s, History(), 0.5).delay == pytest.approx(2.5)
    assert on_normal_exit(s, History(), 0.999).delay == pytest.approx(2.999)


def test_normal_exit_clears_streak_keeps_intensity_window() -> None:
    d = on_normal_exit(spec(), History(4, (1.0, 2.0)), 0.0)
    assert d.action == Action.RESTART
    assert d.history == History(0, (1.0, 2.0))


def test_backoff_sequence_doubles_to_cap() -> None:
    s = spec(backoff_base=0.1, backoff_cap=1.0, intensity=100)
    hist, now, delays = History(), 0.0, []
    for _ in range(8):
        d = on_crash(s, hist, now, ran_for=0.01)
        delays.append(d.delay)
        hist, now = d.history, now + d.delay + 0.01
    assert delays == pytest.approx([0.0, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])


def test_backoff_delay_function() -> None:
    s = spec(backoff_base=0.5, backoff_cap=3.0)
    assert [backoff_delay(s, n) for n in range(0, 6)] == [0.0, 0.0, 0.5, 1.0, 2.0, 3.0]


def test_stable_run_resets_streak() -> None:
    s = spec(backoff_reset_after=10.0)
    d = on_crash(s, History(streak=6, restarts=()), now=100.0, ran_for=10.0)
    assert d.history.streak == 1 and d.delay == 0.0
    d = on_crash(s, History(streak=6, restarts=()), now=100.0, ran_for=9.99)
    assert d.history.streak == 7 and d.delay == 1.0


def test_intensity_limit_goes_fatal() -> None:
    s = spec(intensity=3, intensity_period=10.0, backoff_base=0.0, backoff_cap=0.0)
    hist = History()
    for t in (0.0, 1.0, 2.0):
        d = on_crash(s, hist, t, ran_for=0.1)
        assert d.action == Action.RESTART
        hist = d.history
    d = on_crash(s, hist, 3.0, ran_for=0.1)
    assert d.action == Action.FATAL
    assert "4 crashes within 10s (intensity 3)" in d.reason


def test_intensity_window_slides() -> None:
    s = spec(intensity=2, intensity_period=10.0)
    hist = History(0, (0.0, 5.0))
    assert on_crash(s, hist, 9.9, ran_for=0.1).action == Action.FATAL
    d = on_crash(s, hist, 10.0, ran_for=0.1)  # the crash at 0.0 left the window
    assert d.action == Action.RESTART
    assert d.history.restarts == (5.0, 10.0)
