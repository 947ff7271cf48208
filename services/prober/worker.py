"""One probe worker per (pod, container, probe kind): the kubelet's prober ``worker.doProbe``.
Pure: no I/O, no threads; the caller passes monotonic ``now`` and runs the probes.

Life of a worker:

- A new container (new container ID) resets it: the result goes back to the kind's initial value
  (readiness Failure, liveness Success, startup Unknown), the run counter to 0, and the hold
  after a liveness/startup failure is lifted.
- ``tick(obs, now, started)`` is called when ``next_due`` has come (or the observation changed);
  it answers whether a probe must run now. It does not probe a container that is not running,
  one on hold (after a liveness/startup failure: wait for the new container), a probe still in
  flight, a container inside ``initialDelaySeconds``, a liveness/readiness probe before the
  startup probe succeeded, or a startup probe after it did.
- ``complete(container_id, outcome)``: a result flips only after ``successThreshold`` /
  ``failureThreshold`` identical results in a row. ``UNKNOWN`` (the handler could not tell, e.g.
  the runtime is unreachable) is not counted either way (the kubelet counts errors as failures;
  a runtime restart must not kill healthy containers).
- Scheduling: every ``periodSeconds``; the first probe of a worker created less than one period
  after the prober started is delayed by ``rand() * period`` (no probe storm after a restart,
  kubernetes #52154). Unlike the kubelet, a container inside its initial delay is probed as soon
  as the delay ends rather than at the next period tick.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass


class Kind(enum.StrEnum):
    LIVENESS = "liveness"
    READINESS = "readiness"
    STARTUP = "startup"


class Result(enum.StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    UNKNOWN = "unknown"


INITIAL = {Kind.READINESS: Result.FAILURE, Kind.LIVENESS: Result.SUCCESS,
           Kind.STARTUP: Result.UNKNOWN}


@dataclass(frozen=True)
class Timing:
    """A probe's numbers, in seconds (the pod model's defaults: 0/10/1/1/3)."""

    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3


@dataclass(frozen=True)
class ContainerObs:
    """What the worker knows of its container: the newest one of its name."""

    container_id: str
    running: bool
    started_at: float  # monotonic seconds of the container's start (0 when unknown)


@dataclass(frozen=True)
class Seed:
    """A result persisted by a previous prober for the same container ID."""

    container_id: str
    result: Result
    on_hold: bool = False


Rand = Callable[[], float]


class ProbeWorker:
    def __init__(self, kind: Kind, timing: Timing, now: float, prober_started: float,
                 rand: Rand, seed: Seed | None = None) -> None:
        self.kind = kind
        self.timing = timing
        self.container_id = ""
        self.result = INITIAL[kind]
        self.last = Result.UNKNOWN
        self.run = 0
        self.on_hold = False
        self.in_flight = False
        self.probes = 0
        self.running = False
        self._seed = seed
        delay = rand() * timing.period if now - prober_started < timing.period else 0.0
        self.first_due = now + delay
        self.next_due = self.first_due

    # --- container changes ---
    def observe(self, obs: ContainerObs | None, now: float | None = None) -> bool:
        """Follow the container; True when a new one appeared (the worker is reset) or the
        same one started running. With ``now``, such a change makes the worker due at once
        (but never before its first, possibly delayed, turn)."""
        if obs is None:
            return False
        if obs.container_id == self.container_id:
            began = obs.running and not self.running
            self.running = obs.running
            if began and now is not None:
                self.next_due = min(self.next_due, max(now, self.first_due))
            return began
        self.container_id, self.running = obs.container_id, obs.running
        if now is not None:
            self.next_due = min(self.next_due, max(now, self.first_due))
        self.result, self.last, self.run = INITIAL[self.kind], Result.UNKNOWN, 0
        self.on_hold = self.in_flight = False
        if self._seed is not None and self._seed.container_id == obs.container_id:
            self.result, self.on_hold = self._seed.result, self._seed.on_hold
        self._seed = None
        return True

    # --- the tick ---
    def tick(self, obs: ContainerObs | None, now: float, started: bool) -> bool:
        """Called at ``next_due``; True when a probe must run now (it is then in flight).
        ``started``: whether the container's startup probe succeeded (True without one)."""
        self.observe(obs)
        self.next_due = now + self.timing.period
        if obs is None or not obs.running or self.on_hold or self.in_flight:
            return False
        if self.kind is Kind.STARTUP and started:
            return False  # startup done: keep the worker for the next container
        if self.kind is not Kind.STARTUP and not started:
            return False
        ready_at = obs.started_at + self.timing.initial_delay
        if now < ready_at:
            self.next_due = min(self.next_due, ready_at)
            return False
        self.in_flight = True
        self.probes += 1
        return True

    def complete(self, container_id: str, outcome: Result) -> bool:
        """A probe's outcome; True when the published result changed."""
        if container_id != self.container_id:
            return False  # a late answer about a container that is gone
        self.in_flight = False
        if outcome is Result.UNKNOWN or self.on_hold:
            return False
        if outcome is self.last:
            self.run += 1
        else:
            self.last, self.run = outcome, 1
        threshold = (self.timing.failure_threshold if outcome is Result.FAILURE
                     else self.timing.success_threshold)
        if self.run < threshold:
            return False
        changed = self.result is not outcome
        self.result = outcome
        if outcome is Result.FAILURE and self.kind is not Kind.READINESS:
            self.on_hold, self.run = True, 0
        return changed
