"""Supervisor decisions with a fake clock and FakeSpawner (no real processes)."""

from __future__ import annotations

import signal
from dataclasses import replace
from typing import Any

from podvisor.common import FakeClock
from podvisor.common.logs import MemoryLogger
from podvisor.ipc.control import ProcessState
from podvisor.supervisor.core import CoreDeps, Supervisor
from podvisor.supervisor.heartbeat import BEAT, READY, Beat
from podvisor.supervisor.reconcile import apply_specs
from podvisor.supervisor.registry import ProcessSpec
from podvisor.supervisor.spawner import ExitStatus, FakeSpawner
from podvisor.supervisor.states import StateChange

S = ProcessState


def make(*specs: ProcessSpec) -> tuple[Supervisor, FakeClock, FakeSpawner, list[StateChange]]:
    clock, spawner, changes = FakeClock(100.0), FakeSpawner(), []
    deps = CoreDeps(clock, lambda: 1e9 + clock.now, spawner, changes.append, MemoryLogger(),
                    lambda: 0.0, {"PODVISOR_ROOT_DIR": "/x"})
    return Supervisor(specs, deps), clock, spawner, changes


def spec(name: str = "p", **kw: Any) -> ProcessSpec:
    return ProcessSpec(name=name, module=f"m.{name}", **kw)


def ready(sup: Supervisor, spawner: FakeSpawner, name: str = "p") -> None:
    sup.on_beat(Beat(READY, name, spawner.last(name).pid, 0.0))


def die(sup: Supervisor, spawner: FakeSpawner, status: ExitStatus, name: str = "p") -> None:
    spawner.last(name).exit(status)
    sup.on_exit(name)


def test_start_ready_crash_restart_at_once_then_backoff() -> None:
    sup, clock, spawner, changes = make(spec(backoff_base=0.5, backoff_cap=2.0))
    sup.start_all()
    assert sup.procs["p"].state == S.STARTING
    ready(sup, spawner)
    assert sup.procs["p"].state == S.RUNNING
    die(sup, spawner, ExitStatus(None, signal.SIGKILL))
    assert sup.procs["p"].state == S.BACKOFF
    sup.tick()
    assert sup.procs["p"].state == S.STARTING and sup.procs["p"].restarts == 1
    die(sup, spawner, ExitStatus(3, None))
    assert sup.tick() == clock.now + 0.5
    assert sup.procs["p"].state == S.BACKOFF
    clock.now += 0.5
    sup.tick()
    assert sup.procs["p"].state == S.STARTING
    assert [c.to_state for c in changes][:4] == [S.STARTING, S.RUNNING, S.BACKOFF, S.STARTING]
    assert changes[2].exit_signal == signal.SIGKILL and changes[2].reason == "killed by SIGKILL"
    env = spawner.spawned[0][1]
    assert env.pid == changes[0].pid


def test_stale_beats_of_old_incarnation_are_ignored() -> None:
    sup, _, _spawner, _ = make(spec())
    sup.start_all()
    sup.on_beat(Beat(READY, "p", 999999, 0.0))
    assert sup.procs["p"].state == S.STARTING
    sup.on_beat(Beat(BEAT, "nope", 1, 0.0))


def test_a_late_heartbeat_is_said_once_each_way_before_the_timeout() -> None:
    """No beat for ``late_after``: one ``on_late(True)`` (the loop wakes for it), one
    ``on_late(False)`` at the next beat; nothing while beats come in time; a timeout below
    ``late_after`` leaves it to the timeout; a new state clears it without a word."""
    sup, clock, spawner, _ = make(spec(heartbeat_timeout=10.0))
    said: list[tuple[str, bool, float]] = []
    sup.d = replace(sup.d, late_after=lambda: 3.0,
                    on_late=lambda proc, late, age: said.append((proc.name, late, age)))
    sup.start_all()
    ready(sup, spawner)
    for _ in range(5):  # beats every 2 s: never late (the loop ticks after each drain)
        clock.now += 2.0
        sup.on_beat(Beat(BEAT, "p", spawner.last("p").pid, 0.0))
        sup.tick()
    assert said == [] and not sup.procs["p"].late
    assert sup.next_deadline() == clock.now + 3.0 + 0.001  # it wakes for the lateness
    clock.now += 3.5
    sup.tick()
    sup.tick()
    assert said == [("p", True, 3.5)] and sup.procs["p"].status(clock.now, 0.0).heartbeat_late
    assert sup.next_deadline() == clock.now - 3.5 + 10.0 + 0.001  # now only the timeout
    sup.on_beat(Beat(BEAT, "p", spawner.last("p").pid, 0.0))
    assert said[-1] == ("p", False, 0.0) and not sup.procs["p"].late
    sup.tick()
    clock.now += 3.5
    sup.tick()
    assert said[-1][1] is True
    die(sup, spawner, ExitStatus(None, signal.SIGKILL))
    assert not sup.procs["p"].late and len(said) == 3
    quiet, qclock, qspawner, _ = make(spec(heartbeat_timeout=2.0))
    quiet.d = replace(quiet.d, late_after=lambda: 3.0,
                      on_late=lambda proc, late, age: said.append((proc.name, late, age)))
    quiet.start_all()
    ready(quiet, qspawner)
    qclock.now += 2.5
    quiet.tick()
    assert len(said) == 3 and quiet.procs["p"].state == S.STOPPING  # the timeout acted


def test_lateness_follows_the_interval_each_incarnation_started_with() -> None:
    """A reload that lengthens the heartbeat interval changes ``late_after()``: the running
    incarnation (which beats at the interval it read) keeps its value, the next one gets the
    new one and is not called late for beating at its slower pace."""
    sup, clock, spawner, _ = make(spec(heartbeat_timeout=10.0))
    current = [3.0]
    said: list[tuple[str, bool, float]] = []
    sup.d = replace(sup.d, late_after=lambda: current[0],
                    on_late=lambda proc, late, age: said.append((proc.name, late, age)))
    sup.start_all()
    ready(sup, spawner)
    current[0] = 6.0  # the reload
    clock.now += 3.5
    sup.tick()
    assert said == [("p", True, 3.5)]  # the old incarnation: 3 s
    first = spawner.last("p").pid
    die(sup, spawner, ExitStatus(None, signal.SIGKILL))
    sup.tick()  # the first crash restarts at once
    assert spawner.last("p").pid != first
    ready(sup, spawner)
    assert sup.procs["p"].late_after == 6.0
    assert sup.next_deadline() == clock.now + 6.0 + 0.001
    clock.now += 5.0
    sup.tick()
    assert len(said) == 1 and not sup.procs["p"].late  # a beat every 5 s is in time now
    clock.now += 1.5
    sup.tick()
    assert said[-1] == ("p", True, 6.5)


def test_missing_heartbeat_sigterm_then_sigkill_then_crash_restart() -> None:
    sup, clock, spawner, _ = make(spec(heartbeat_timeout=2.0, stop_timeout=1.0))
    sup.start_all()
    ready(sup, spawner)
    handle = spawner.last("p")
    clock.now += 2.5
    sup.tick()
    assert sup.procs["p"].state == S.STOPPING
    assert handle.signals == [signal.SIGTERM, signal.SIGCONT]
    clock.now += 1.0
    sup.tick()
    assert handle.signals[-1] == signal.SIGKILL
    die(sup, spawner, ExitStatus(None, signal.SIGKILL))
    proc = sup.procs["p"]
    assert proc.state == S.BACKOFF
    assert proc.last_exit is not None and "no heartbeat for 2s" in proc.last_exit.reason


def test_not_ready_in_time_counts_as_hung() -> None:
    sup, clock, _spawner, _ = make(spec(heartbeat_timeout=1.0))
    sup.start_all()
    clock.now += 1.0
    sup.tick()
    assert sup.procs["p"].state == S.STOPPING
    assert "not ready within 1s" in sup.procs["p"].reason


def test_intensity_makes_fatal_and_operator_start_resets() -> None:
    sup, _clock, spawner, _ = make(spec(intensity=2, backoff_base=0.0, backoff_cap=0.0))
    sup.start_all()
    for _ in range(2):
        die(sup, spawner, ExitStatus(1, None))
        sup.tick()
    die(sup, spawner, ExitStatus(1, None))
    assert sup.procs["p"].state == S.FATAL
    sup.tick()
    assert sup.procs["p"].state == S.FATAL
    sup.start("p")
    assert sup.procs["p"].state == S.STARTING


def test_spawn_failure_is_a_crash() -> None:
    sup, _, spawner, _ = make(spec())
    spawner.fail_next = 1
    sup.start_all()
    proc = sup.procs["p"]
    assert proc.state == S.BACKOFF
    assert proc.last_exit is not None and "spawn failed" in proc.last_exit.reason
    sup.tick()
    assert proc.state == S.STARTING


def test_normal_exit_waits_period() -> None:
    sup, clock, spawner, _ = make(spec(period=3.0))
    sup.start_all()
    ready(sup, spawner)
    die(sup, spawner, ExitStatus(0, None))
    assert sup.procs["p"].state == S.EXITED
    assert sup.tick() == clock.now + 3.0
    clock.now += 3.0
    sup.tick()
    assert sup.procs["p"].state == S.STARTING


def test_stop_restart_kill() -> None:
    sup, _, spawner, _ = make(spec())
    sup.start_all()
    ready(sup, spawner)
    sup.kill("p", signal.SIGUSR1)
    assert spawner.last("p").signals == [signal.SIGUSR1]
    first = spawner.last("p")
    sup.restart("p")
    die(sup, spawner, ExitStatus(0, None))
    assert spawner.last("p") is not first and sup.procs["p"].state == S.STARTING
    sup.stop("p")
    die(sup, spawner, ExitStatus(0, None))
    assert sup.procs["p"].state == S.STOPPED
    sup.tick()
    assert sup.procs["p"].state == S.STOPPED


def test_shutdown_reverse_order_with_deadline() -> None:
    sup, clock, spawner, _ = make(spec("a"), spec("b"), spec("c"))
    sup.start_all()
    sup.begin_shutdown(timeout=10.0)
    sup.tick()
    assert [n for n, p in sup.procs.items() if p.state == S.STOPPING] == ["c"]
    die(sup, spawner, ExitStatus(0, None), "c")
    sup.tick()
    assert sup.procs["b"].state == S.STOPPING
    clock.now += 10.0
    sup.tick()
    assert spawner.last("a").signals[-1] == signal.SIGKILL
    die(sup, spawner, ExitStatus(None, 9), "a")
    die(sup, spawner, ExitStatus(None, 9), "b")
    assert sup.shutdown_done


def test_reload_adds_removes_enables() -> None:
    sup, _, spawner, _ = make(spec("a"), spec("b"), spec("c", enabled=False))
    sup.start_all()
    changes = apply_specs(sup, [spec("a", period=5.0), spec("c"), spec("d")])
    assert "b: removed" in changes and "d: added" in changes
    assert "a: period 1.0 -> 5.0" in changes
    assert sup.procs["b"].state == S.STOPPING
    die(sup, spawner, ExitStatus(0, None), "b")
    assert "b" not in sup.procs
    assert sup.procs["c"].state == S.STARTING and sup.procs["d"].state == S.STARTING
    assert list(sup.procs) == ["a", "c", "d"]


def test_late_wake_of_the_loop_forgives_silence() -> None:
    sup, clock, spawner, _ = make(spec(heartbeat_timeout=2.0))
    sup.start_all()
    ready(sup, spawner)
    sup.tick()
    clock.now += 30.0  # the agent itself was stopped
    sup.tick()
    assert sup.procs["p"].state == S.RUNNING
    clock.now += 2.5
    sup.tick()
    assert sup.procs["p"].state == S.STOPPING
