"""Pure parts of the event listeners: the READY/RESULT feeder and supervisord's payloads."""

from __future__ import annotations

import pytest

from podvisor.ipc.control import ProcessState
from podvisor.services.ops.events import (
    Transition,
    agent_transitions,
    container_events,
    matches,
    payload,
)
from podvisor.services.ops.feeder import EventFeeder, ListenerState, ProtocolError
from podvisor.services.ops.procs import Proc


def test_feeder_protocol_ok_fail_and_bound() -> None:
    f = EventFeeder("crashmail", queue_max=2)
    f.push("TICK_5", "when:5")
    assert f.next_message() is None  # not READY yet
    f.feed(b"READY\n")
    msg = f.next_message()
    assert msg == (b"ver:3.0 server:supervisor serial:1 pool:crashmail poolserial:1 "
                   b"eventname:TICK_5 len:6\nwhen:5")
    assert f.state == ListenerState.BUSY
    f.feed(b"RESULT 4\nFA")
    assert f.state == ListenerState.BUSY  # partial body
    f.feed(b"IL")
    assert f.failed == 1 and len(f.queue) == 1  # rebuffered
    f.feed(b"READY\n")
    assert f.next_message() is not None
    f.feed(b"RESULT 2\nOKREADY\n")
    assert f.sent == 1 and f.state == ListenerState.READY
    for i in range(3):
        f.push("TICK_5", f"when:{i}")
    assert f.dropped == 1 and len(f.queue) == 2
    with pytest.raises(ProtocolError):
        EventFeeder("x").feed(b"hello\n")


def test_payloads_as_supervisord_writes_them() -> None:
    t = Transition("agent", "pleg", "RUNNING", "EXITED", 12, expected=0)
    assert payload(t) == "processname:pleg groupname:agent from_state:RUNNING expected:0 pid:12"
    assert payload(Transition("g", "a", "STOPPED", "STARTING", tries=2)) == (
        "processname:a groupname:g from_state:STOPPED tries:2")
    assert payload(Transition("g", "a", "STARTING", "RUNNING", 7)).endswith("pid:7")
    assert payload(Transition("g", "a", "BACKOFF", "FATAL")) == (
        "processname:a groupname:g from_state:BACKOFF")


@pytest.mark.parametrize(("edge", "prev_crash", "want"), [
    (("RUNNING", "BACKOFF"), False, [("RUNNING", "EXITED", 0)]),
    (("BACKOFF", "STARTING"), True, [("EXITED", "STARTING", 1)]),
    (("BACKOFF", "STARTING"), False, [("BACKOFF", "STARTING", 1)]),
    (("STARTING", "RUNNING"), False, [("STARTING", "RUNNING", 1)]),
    (("RUNNING", "EXITED"), False, [("RUNNING", "EXITED", 1)]),
    (("RUNNING", "STOPPING"), False, [("RUNNING", "STOPPING", 1)]),
])
def test_agent_translation(edge: tuple[str, str], prev_crash: bool,
                           want: list[tuple[str, str, int]]) -> None:
    got = agent_transitions("agent", "pleg", *edge, 5, 0 if edge[1] == "EXITED" else None, 1,
                            prev_crash)
    assert [(t.from_state, t.to_state, t.expected if t.to_state == "EXITED" else 1)
            for t in got] == want


def _c(state: ProcessState, cid: str, code: int = 0, exits: dict[str, int] | None = None,
       last: int | None = 137) -> Proc:
    return Proc("default.web", "app", "container", state, 10, 1.0, 0.0, code, "", "",
                extra={"container_id": cid}, exits=exits or {}, last_exit_code=last)


def test_container_events() -> None:
    run_a, run_b = _c(ProcessState.RUNNING, "a"), _c(ProcessState.RUNNING, "b")
    assert container_events({"x": run_a}, {"x": run_a}) == []
    fast = container_events({"x": run_a}, {"x": run_b})
    assert [(t.from_state, t.to_state) for t in fast] == [
        ("RUNNING", "EXITED"), ("EXITED", "STARTING"), ("STARTING", "RUNNING")]
    assert fast[0].expected == 0
    died = container_events({"x": run_a}, {"x": _c(ProcessState.EXITED, "a", 1)})
    assert [(t.from_state, t.to_state, t.expected) for t in died] == [("RUNNING", "EXITED", 0)]
    assert [t.to_state for t in container_events({"x": run_a}, {})] == ["STOPPED"]
    # restarted, the new container not started yet: the old container's exit code decides
    # (the runtime's listing first; the new one's own code, 0, says nothing of the old)
    for exits, last, expected in (({"a": 137}, None, 0), ({"a": 0}, 137, 1),
                                  ({}, 137, 0), ({}, None, 0), ({"z": 0}, None, 0)):
        slow = container_events({"x": run_a},
                                {"x": _c(ProcessState.STARTING, "b", 0, exits, last)})
        assert [(t.from_state, t.to_state) for t in slow] == [
            ("RUNNING", "EXITED"), ("EXITED", "STARTING")]
        assert slow[0].expected == expected, (exits, last)
    assert [t.to_state for t in container_events({}, {"x": run_a})] == ["RUNNING"]


def test_matches_nests_types() -> None:
    assert matches(["PROCESS_STATE"], "PROCESS_STATE_EXITED")
    assert matches(["EVENT"], "TICK_5") and matches(["TICK"], "TICK_60")
    assert not matches(["PROCESS_STATE_EXITED"], "PROCESS_STATE_RUNNING")
    assert not matches(["TICK_60"], "TICK_5")
