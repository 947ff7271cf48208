"""``FakeChildContext``, the fake beside ``ChildContext``: the real one's interface built from a
run directory, its log kept in memory, its heartbeats counted, and its knobs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import zmq

from podvisor.common import SYSTEM_CLOCK, ChildContext, Config, FakeChildContext, FakeClock
from podvisor.common.config import config_from_mapping
from podvisor.ipc.paths import RunPaths


def test_defaults_are_the_real_contexts(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    ctx = FakeChildContext(paths, "pleg")
    assert isinstance(ctx, ChildContext)
    assert (ctx.name, ctx.paths, ctx.clock) == ("pleg", paths, SYSTEM_CLOCK)
    assert ctx.config == Config(root_dir=str(tmp_path))
    assert ctx.zctx is zmq.Context.instance()
    assert not ctx.stop.is_set() and ctx.stop_fd is not None
    ctx.log.bind(pod="p").info("x.happened", n=1)
    assert ctx.log.named("x.happened") == [{"level": "info", "event": "x.happened", "pod": "p",
                                            "n": 1}]


def test_heartbeats_are_counted_and_passed_on(tmp_path: Path) -> None:
    seen: list[int] = []
    ctx = FakeChildContext(RunPaths(tmp_path), beat=lambda: seen.append(1))
    ctx.heartbeat()
    ctx.heartbeat()
    assert ctx.beats == 2 and seen == [1, 1]
    copy = dataclasses.replace(ctx, clock=FakeClock())  # what a test does to swap the clock
    copy.heartbeat()
    copy.log.info("from.the.copy")
    assert isinstance(copy, FakeChildContext) and isinstance(copy.clock, FakeClock)
    assert ctx.beats == copy.beats == 3 and seen == [1, 1, 1]
    assert ctx.log.named("from.the.copy")


def test_the_heartbeat_interval_knob_is_the_configs(tmp_path: Path) -> None:
    ctx = FakeChildContext(RunPaths(tmp_path), heartbeat_interval=0.05)
    assert ctx.heartbeat_interval == 0.05
    assert ctx.config == config_from_mapping({"rootDir": str(tmp_path),
                                              "supervision": {"heartbeatInterval": "50ms"}})


def test_sleep_heartbeats_on_the_given_clock_and_ends_at_stop(tmp_path: Path) -> None:
    ctx = FakeChildContext(RunPaths(tmp_path), heartbeat_interval=0.01, clock=FakeClock())
    ctx.stop.set()
    assert ctx.sleep(3600.0) is True  # at once: stop is set (the fake clock never moves)
    assert ctx.beats >= 1
