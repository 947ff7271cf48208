"""The dashboard feed's decisions (``services/ops/feed.py``, pure): when the broadcaster
computes, pings or sleeps, what of the subsystems counts as a change, the frames' bytes."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from podvisor.ipc.control import ProcessRow
from podvisor.services.ops.feed import (
    Action,
    FeedPlan,
    FeedTimes,
    Step,
    agent_key,
    frame,
    ping_frame,
)
from podvisor.services.ops.procs import agent_procs

TIMES = FeedTimes(min_gap=0.1, keepalive=15.0, recheck=60.0)


def _plan(last_compute: float, last_send: float) -> FeedPlan:
    plan = FeedPlan(TIMES)
    plan.computed(last_compute)
    plan.sent(last_send)
    return plan


@pytest.mark.parametrize(("now", "moved", "step"), [
    # something moved: compute, unless the last computation is less than min_gap old
    (101.0, True, Step(Action.COMPUTE)),
    (100.05, True, Step(Action.WAIT, 100.1)),
    (100.1, True, Step(Action.COMPUTE)),
    # nothing moved: sleep until the next ping or recheck, whichever comes first
    (100.05, False, Step(Action.WAIT, 115.0)),
    (114.9, False, Step(Action.WAIT, 115.0)),
    (115.0, False, Step(Action.PING)),
    # a recheck is due: compute (it sends only a changed state)
    (160.0, False, Step(Action.COMPUTE)),
])
def test_plan_after_a_state_sent_at_100(now: float, moved: bool, step: Step) -> None:
    assert _plan(100.0, 100.0).next(now, moved) == step


def test_plan_a_subsystem_moved_inside_the_gap_is_shown_at_once() -> None:
    """A process state change is not held by the gap (the subsystems' rows are cheap); after
    the gap the full state follows; outside the gap it is a full computation."""
    plan = _plan(100.0, 100.0)
    assert plan.next(100.02, True, agents_moved=True) == Step(Action.AGENTS)
    assert plan.next(100.03, True, agents_moved=False) == Step(Action.WAIT, 100.1)
    assert plan.next(100.1, True, agents_moved=False) == Step(Action.COMPUTE)
    assert plan.next(100.5, True, agents_moved=True) == Step(Action.COMPUTE)


def test_plan_a_fresh_plan_computes_at_once() -> None:
    """A first client gets a state without waiting for a change."""
    assert FeedPlan(TIMES).next(0.0, False) == Step(Action.COMPUTE)


def test_plan_pings_follow_the_last_send_and_rechecks_the_last_computation() -> None:
    plan = _plan(100.0, 100.0)
    plan.sent(115.0)  # a ping
    assert plan.next(115.0, False) == Step(Action.WAIT, 130.0)
    plan.sent(145.0)
    assert plan.next(145.0, False) == Step(Action.WAIT, 160.0)
    plan.computed(160.0)  # a recheck that sent nothing: the next ping is still due at 160
    assert plan.next(160.0, False) == Step(Action.PING)
    plan.sent(160.0)
    assert plan.next(160.0, False) == Step(Action.WAIT, 175.0)


def test_plan_idle_wakes_at_most_once_per_keepalive() -> None:
    """With nothing moving, an hour costs one ping per keepalive and one computation per
    recheck: walk the plan as the broadcaster does and count."""
    plan, now, pings, computes = FeedPlan(TIMES), 0.0, 0, 0
    while now < 3600.0:
        step = plan.next(now, False)
        if step.action is Action.COMPUTE:
            plan.computed(now)
            computes += 1
            if computes == 1:
                plan.sent(now)  # the first state; the rechecks find nothing new
        elif step.action is Action.PING:
            plan.sent(now)
            pings += 1
        else:
            assert step.at > now and math.isfinite(step.at)
            now = step.at
    assert computes == 3600 / TIMES.recheck  # at 0, 60, ..., 3540
    assert pings == 3600 / TIMES.keepalive - 1  # at 15, 30, ..., 3585


def _rows(now: float, **change: object) -> list[ProcessRow]:
    row: dict[str, object] = {
        "name": "pleg", "state": "RUNNING", "pid": 40, "restarts": 1,
        "uptime": round(now - 1000.123, 3), "module": "podvisor.services.pleg.main",
        "reason": "", "lastExit": {"code": None, "signal": 9, "time": 990.5, "ranFor": 3.2},
        "heartbeatAge": round(now % 1.0, 3), "heartbeatLate": False}  # a fresh age each ask
    return [ProcessRow.from_wire({**row, **change})]


def test_agent_key_ignores_time_and_sees_what_the_page_shows(tmp_path: Path) -> None:
    base = agent_key(agent_procs(_rows(2000.0), 2000.0, tmp_path))
    # later, the same processes: another now, a start that jitters by the uptime's rounding
    assert agent_key(agent_procs(_rows(2012.0004), 2012.0, tmp_path)) == base
    # the heartbeat's age alone moves at every ask: not a change of what the page shows
    assert agent_key(agent_procs(_rows(2000.7), 2000.7, tmp_path)) == base
    for change in ({"pid": 41}, {"state": "BACKOFF"}, {"restarts": 2},
                   {"reason": "heartbeat missed"}, {"heartbeatLate": True},
                   {"lastExit": {"code": 1, "signal": None, "time": 1999.0, "ranFor": 5.0}}):
        moved = agent_key(agent_procs(_rows(2000.0, **change), 2000.0, tmp_path))
        assert moved != base, change


def test_agent_key_sees_a_stop_time_and_an_exit_status(tmp_path: Path) -> None:
    (proc,) = agent_procs(_rows(2000.0), 2000.0, tmp_path)
    assert agent_key([replace(proc, stop=proc.stop + 1)]) != agent_key([proc])
    assert agent_key([replace(proc, exitstatus=3)]) != agent_key([proc])


def test_frames_are_one_server_sent_event_each() -> None:
    assert frame("state", '{"a":1}') == b'event: state\ndata: {"a":1}\n\n'
    ping = ping_frame(1700000000.7, 15.0)
    head, data, end = ping.split(b"\n", 2)
    assert head == b"event: ping" and end == b"\n"
    assert json.loads(data.removeprefix(b"data: ")) == {"now": 1700000000, "every": 15.0}
