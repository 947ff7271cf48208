"""``ServiceLoop.worker``: the one helper thread of every service process (issue 23). Its
results reach the loop's thread in order, its failure and its stall (on the injected clock)
are raised there, it waits between steps on the loop's clock and wakes on ``wake()``, and the
loop stops it at ``close()``. (These were ``LoopWorker``'s and ``run_in_thread``'s tests
in tests/services/sources/test_sources_worker.py before the source processes used the loop's
worker.)"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from podvisor.common import FakeChildContext, FakeClock
from podvisor.common.service import ServiceLoop, WorkerStalled
from podvisor.ipc.clock import SYSTEM_CLOCK, Clock
from podvisor.ipc.paths import RunPaths

WaitFor = Callable[..., Any]


class Beats:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def _ctx(root: Path, clock: Clock, beats: Beats) -> FakeChildContext:
    return FakeChildContext(RunPaths(root), "t", heartbeat_interval=0.05, clock=clock, beat=beats)


@pytest.fixture
def beats() -> Beats:
    return Beats()


@pytest.fixture
def loop(tmp_path: Path, beats: Beats) -> Iterator[ServiceLoop]:
    service = ServiceLoop(_ctx(tmp_path, SYSTEM_CLOCK, beats))
    yield service
    service.close()


def idle(now: float) -> None:
    return None


def test_results_reach_the_loop_thread_in_order(loop: ServiceLoop, wait_for: WaitFor) -> None:
    got: list[tuple[int, bool]] = []
    counter = iter(range(1, 4))

    def step(now: float) -> float | None:
        n = next(counter, None)
        if n is None:
            return None  # until woken (never)
        worker.put(n)
        return now  # again at once

    worker = loop.worker(step, stall=None, name="count",
                         deliver=lambda n: got.append(
                             (n, threading.current_thread() is threading.main_thread())))
    wait_for(lambda: len(got) >= 3, pump=lambda: loop.turn(idle), message="three results")
    assert got[:3] == [(1, True), (2, True), (3, True)]


def test_a_failing_step_ends_the_loop_with_its_exception(loop: ServiceLoop) -> None:
    def boom(now: float) -> float:
        raise ValueError("bad step")

    loop.worker(boom, stall=None, name="boom")
    with pytest.raises(ValueError, match="bad step"):
        loop.run(idle)  # woken by the failure: no deadline to wait for


def test_results_put_before_a_failure_are_delivered_first(loop: ServiceLoop) -> None:
    got: list[str] = []

    def step(now: float) -> float:
        worker.put("last words")
        raise KeyError("x")

    worker = loop.worker(step, stall=None, name="w", deliver=got.append)
    with pytest.raises(KeyError):
        loop.run(idle)
    assert got == ["last words"]


def test_a_step_without_progress_is_a_stall_on_the_injected_clock(
        tmp_path: Path, beats: Beats) -> None:
    clock = FakeClock(100.0)
    loop = ServiceLoop(_ctx(tmp_path, clock, beats))
    entered, release = threading.Event(), threading.Event()
    ticking, ticked = threading.Event(), threading.Event()

    def hang(now: float) -> None:
        entered.set()
        release.wait(30)
        return None

    def busy(now: float) -> None:  # a long step that says it is still working
        while not release.is_set():
            ticking.wait(30)
            ticking.clear()
            worker.tick()
            ticked.set()
        return None

    loop.worker(hang, stall=60.0, name="hang")
    worker = loop.worker(busy, stall=60.0, name="busy")
    try:
        loop.turn(idle)  # starts them
        assert entered.wait(10)
        clock.advance(59.0)
        ticking.set()
        assert ticked.wait(10)
        loop.turn(idle)  # not yet
        clock.advance(2.0)
        with pytest.raises(WorkerStalled, match="hang"):
            loop.turn(idle)
    finally:
        release.set()
        ticking.set()
        loop.close()


def test_waiting_between_steps_is_no_stall_and_wake_runs_a_step(
        tmp_path: Path, beats: Beats, wait_for: WaitFor) -> None:
    clock = FakeClock(100.0)
    loop = ServiceLoop(_ctx(tmp_path, clock, beats))
    steps: list[float] = []

    def step(now: float) -> float:
        steps.append(now)
        return now + 10.0  # on the fake clock: never comes by itself in this test

    worker = loop.worker(step, stall=1.0, name="periodic")
    try:
        loop.turn(idle)
        wait_for(lambda: steps == [100.0], message="the first step at once")
        clock.advance(1000.0)
        loop.turn(idle)  # waiting, not stalled
        worker.wake()
        wait_for(lambda: steps == [100.0, 1100.0], message="a woken step")
    finally:
        loop.close()
    assert not worker.alive


def test_a_one_shot_runs_while_the_loop_heartbeats(loop: ServiceLoop, beats: Beats) -> None:
    """RunOnce's shape: one step that blocks long, its result delivered, the loop ends."""
    results: list[str] = []

    def work(now: float) -> None:
        while beats.count < 2:  # the loop keeps beating while the step works
            threading.Event().wait(0.01)
        worker.put("done")
        return None

    worker = loop.worker(work, stall=None, name="once", deliver=results.append)
    loop.run(idle, done=lambda: bool(results))
    assert results == ["done"] and beats.count >= 2


def test_stop_ends_the_loop_and_close_leaves_a_blocked_step(tmp_path: Path,
                                                           beats: Beats) -> None:
    ctx = _ctx(tmp_path, SYSTEM_CLOCK, beats)
    loop = ServiceLoop(ctx)
    release, entered = threading.Event(), threading.Event()

    def blocked(now: float) -> None:
        entered.set()
        release.wait(30)
        return None

    worker = loop.worker(blocked, stall=None, name="blocked", join_timeout=0.05)
    loop.turn(idle)
    assert entered.wait(10)
    ctx.stop.set()
    loop.run(idle)  # returns at once: stopped
    loop.close()  # waits join_timeout for the step, then leaves the daemon thread
    assert worker.alive
    release.set()
    worker.stop()
    assert not worker.alive
