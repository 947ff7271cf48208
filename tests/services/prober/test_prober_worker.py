"""The probe worker state machine (services/prober/worker.py), with an injected clock and rand."""

from __future__ import annotations

import pytest

from podvisor.services.prober.worker import (
    INITIAL,
    ContainerObs,
    Kind,
    ProbeWorker,
    Result,
    Seed,
    Timing,
)

S, F, U = Result.SUCCESS, Result.FAILURE, Result.UNKNOWN
RUNNING = ContainerObs("c1", True, 0.0)


def worker(kind: Kind = Kind.READINESS, now: float = 100.0, started: float = 0.0,
           rand: float = 0.5, seed: Seed | None = None, **timing: float) -> ProbeWorker:
    return ProbeWorker(kind, Timing(**timing), now, started, lambda: rand, seed)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", list(Kind))
def test_initial_results(kind: Kind) -> None:
    w = worker(kind)
    assert w.result is INITIAL[kind]
    assert INITIAL == {Kind.READINESS: F, Kind.LIVENESS: S, Kind.STARTUP: U}


@pytest.mark.parametrize(("kind", "success", "failure", "outcomes", "results"), [
    # readiness: successThreshold 2 -> two successes in a row to flip
    (Kind.READINESS, 2, 3, [S, F, S, S, F, F, F], [F, F, F, S, S, S, F]),
    (Kind.READINESS, 1, 1, [S, F, S], [S, F, S]),
    # unknown outcomes are not counted and do not break a run
    (Kind.READINESS, 1, 2, [S, F, U, F], [S, S, S, F]),
    # liveness: three failures in a row, then on hold (further outcomes ignored)
    (Kind.LIVENESS, 1, 3, [F, F, S, F, F, F, S], [S, S, S, S, S, F, F]),
    (Kind.STARTUP, 1, 2, [F, S], [U, S]),
    (Kind.STARTUP, 1, 2, [F, F, S], [U, F, F]),
])
def test_thresholds(kind: Kind, success: int, failure: int, outcomes: list[Result],
                    results: list[Result]) -> None:
    w = worker(kind, started=-100.0, success_threshold=success, failure_threshold=failure,
               period=1.0)
    seen = []
    now = 100.0
    for outcome in outcomes:
        w.tick(RUNNING, now, started=kind is not Kind.STARTUP or w.result is not S)
        w.complete("c1", outcome)
        seen.append(w.result)
        now += 1.0
    assert seen == results


def test_liveness_failure_holds_until_new_container() -> None:
    w = worker(Kind.LIVENESS, started=-100, failure_threshold=1, period=1.0)
    assert w.tick(RUNNING, 100.0, True)
    assert w.complete("c1", F) and w.result is F and w.on_hold
    assert not w.tick(RUNNING, 101.0, True)  # same container: wait
    new = ContainerObs("c2", True, 101.0)
    assert w.tick(new, 102.0, True)  # a new container: reset and probe
    assert w.result is S and not w.on_hold and w.container_id == "c2"


def test_late_outcome_of_old_container_ignored() -> None:
    w = worker(started=-100, period=1.0)
    assert w.tick(RUNNING, 100.0, True)
    w.observe(ContainerObs("c2", True, 100.5))
    assert not w.complete("c1", S)
    assert w.result is F and not w.in_flight


def test_in_flight_skips_ticks() -> None:
    w = worker(started=-100, period=1.0)
    assert w.tick(RUNNING, 100.0, True)
    assert not w.tick(RUNNING, 101.0, True)  # still in flight
    w.complete("c1", S)
    assert w.tick(RUNNING, 102.0, True)


@pytest.mark.parametrize(("kind", "started", "probes"), [
    (Kind.READINESS, False, False), (Kind.LIVENESS, False, False), (Kind.STARTUP, False, True),
    (Kind.READINESS, True, True), (Kind.LIVENESS, True, True), (Kind.STARTUP, True, False),
])
def test_only_startup_runs_until_started(kind: Kind, started: bool, probes: bool) -> None:
    assert worker(kind, started=-100).tick(RUNNING, 100.0, started) is probes


def test_not_running_not_probed() -> None:
    w = worker(started=-100)
    assert not w.tick(ContainerObs("c1", False, 0.0), 100.0, True)
    assert not w.tick(None, 110.0, True)


def test_initial_delay_then_due_when_it_ends() -> None:
    w = worker(started=-100, initial_delay=5.0, period=10.0)
    obs = ContainerObs("c1", True, 100.0)
    assert not w.tick(obs, 101.0, True)
    assert w.next_due == 105.0  # the end of the delay, not the next period tick
    assert w.tick(obs, 105.0, True)
    assert w.next_due == 115.0


def test_jitter_only_when_prober_just_started() -> None:
    fresh = worker(now=100.0, started=95.0, rand=0.25, period=10.0)
    assert fresh.next_due == 102.5  # started 5 s ago < one period: delayed by rand * period
    old = worker(now=100.0, started=50.0, rand=0.25, period=10.0)
    assert old.next_due == 100.0


def test_new_container_is_due_at_once_but_not_before_first_turn() -> None:
    w = worker(now=100.0, started=99.0, rand=0.5, period=10.0)  # first turn at 105
    w.observe(ContainerObs("c1", True, 100.0), 101.0)
    assert w.next_due == 105.0
    w.tick(ContainerObs("c1", True, 100.0), 105.0, True)
    w.complete("c1", S)
    w.observe(ContainerObs("c2", True, 107.0), 107.0)
    assert w.next_due == 107.0


def test_container_starting_running_is_due_at_once() -> None:
    w = worker(started=-100, period=10.0)
    assert not w.tick(ContainerObs("c1", False, 0.0), 100.0, True)
    assert w.next_due == 110.0
    assert w.observe(ContainerObs("c1", True, 101.0), 101.0)
    assert w.next_due == 101.0


@pytest.mark.parametrize(("kind", "seed", "result", "hold"), [
    (Kind.READINESS, Seed("c1", S), S, False),
    (Kind.LIVENESS, Seed("c1", F, on_hold=True), F, True),
    (Kind.STARTUP, Seed("c1", S), S, False),
    (Kind.READINESS, Seed("other", S), F, False),  # another container: initial value
])
def test_seed_applies_to_matching_container(kind: Kind, seed: Seed, result: Result,
                                            hold: bool) -> None:
    w = worker(kind, seed=seed)
    w.observe(RUNNING)
    assert (w.result, w.on_hold) == (result, hold)
    w.observe(ContainerObs("c2", True, 5.0))  # the seed is used once
    assert w.result is INITIAL[kind]


def test_seeded_readiness_needs_failures_to_flip() -> None:
    w = worker(seed=Seed("c1", S), started=-100, failure_threshold=3, period=1.0)
    now = 100.0
    for expect in (S, S, F):
        w.tick(RUNNING, now, True)
        w.complete("c1", F)
        assert w.result is expect
        now += 1
