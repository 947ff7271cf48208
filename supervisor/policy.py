"""Restart decisions, as pure functions of (spec, history, now). No I/O, no clock reads.

- A normal return (exit 0) re-runs the process after `period` counted from its end (sliding,
  like `wait.Until`), plus `rand[0,1) * jitter * period` (like `wait.JitterUntil`). It also
  clears the crash streak: the process did its job.
- A crash (non-zero exit, death by signal, killed for missing heartbeats, failure to spawn)
  restarts with exponential back-off: the first crash of a streak restarts at once, the n-th
  waits `min(backoff_cap, backoff_base * 2**(n-2))`. A streak ends when the process had run for
  `backoff_reset_after` seconds before crashing.
- Intensity (OTP supervisors' MaxR/MaxT): when `intensity` crash restarts already happened within
  the last `intensity_period` seconds, the next crash makes the process FATAL instead.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from podvisor.supervisor.registry import ProcessSpec

__all__ = ["Action", "Decision", "History", "on_crash", "on_normal_exit"]


class Action(enum.Enum):
    RESTART = "RESTART"
    FATAL = "FATAL"


@dataclass(frozen=True)
class History:
    """What the policy remembers of one process: the crash streak and recent crash restarts
    (monotonic times). A fresh `History()` is the state after start or an operator action."""

    streak: int = 0
    restarts: tuple[float, ...] = ()


@dataclass(frozen=True)
class Decision:
    action: Action
    delay: float
    history: History
    reason: str


def on_normal_exit(spec: ProcessSpec, history: History, rand: float) -> Decision:
    """Decide after a normal return. `rand` is a draw from [0, 1) (injected for tests)."""
    delay = spec.period + rand * spec.jitter * spec.period
    return Decision(Action.RESTART, delay, History(0, history.restarts), "period")


def backoff_delay(spec: ProcessSpec, streak: int) -> float:
    """The delay before restart number `streak` of a crash streak (1-based)."""
    if streak <= 1:
        return 0.0
    return float(min(spec.backoff_cap, spec.backoff_base * 2.0 ** (streak - 2)))


def on_crash(spec: ProcessSpec, history: History, now: float, ran_for: float) -> Decision:
    """Decide after a crash at monotonic time `now`, after the process ran `ran_for` seconds."""
    streak = 1 if ran_for >= spec.backoff_reset_after else history.streak + 1
    recent = tuple(t for t in history.restarts if now - t < spec.intensity_period)
    if len(recent) >= spec.intensity:
        reason = (
            f"{len(recent) + 1} crashes within {spec.intensity_period:g}s "
            f"(intensity {spec.intensity})"
        )
        return Decision(Action.FATAL, 0.0, History(streak, recent), reason)
    delay = backoff_delay(spec, streak)
    return Decision(Action.RESTART, delay, History(streak, (*recent, now)), "backoff")
