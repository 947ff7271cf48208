"""The fault protocol (ipc/faults.py), the bus gate (ipc/busgate.py) and the supervisor's table
of faults in force (supervisor/faults.py), without an agent (issue 28)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import zmq

from podvisor.common.faultwatch import FaultWatch
from podvisor.common.logs import MemoryLogger
from podvisor.ipc.bus import BusProxy, Publisher, Subscriber
from podvisor.ipc.busgate import BusGate, Verdict
from podvisor.ipc.clock import SYSTEM_CLOCK, FakeClock
from podvisor.ipc.faults import (
    ActiveFault,
    FaultSpec,
    FaultSpecError,
    read_faults,
    spec_from_args,
    write_faults,
)
from podvisor.ipc.messages import Probe
from podvisor.ipc.paths import RunPaths
from podvisor.supervisor.eventstore import EventStore
from podvisor.supervisor.faults import FaultTable
from tests.conftest import short_tmp_dir, wait_for_impl


@pytest.mark.parametrize("args, says", [
    ({"kind": "flood", "target": "pleg"},
     "'kind' must be one of bus, cri, api, disk, resource, kill, stop"),
    ({"kind": "bus"}, "'target' (what the fault hits) is required"),
    ({"kind": "bus", "target": "pleg", "action": "scramble"}, "'action' must be one of drop"),
    ({"kind": "bus", "target": "pleg", "action": "delay"}, "a delay fault needs 'delay'"),
    ({"kind": "bus", "target": "pleg", "direction": "up"}, "'direction' must be one of"),
    ({"kind": "bus", "target": "pleg", "rate": 0}, "'rate' must be a share"),
    ({"kind": "bus", "target": "pleg", "for": -1}, "'for' must be seconds between 0"),
    ({"kind": "bus", "target": "pleg", "methods": ["Version"]}, "a bus fault takes no 'methods'"),
    ({"kind": "cri", "target": "runtime", "action": "error", "code": "OOPS"},
     "'code' must be a gRPC status name"),
    ({"kind": "cri", "target": "runtime"}, "a latency fault needs 'delay'"),
    ({"kind": "cri", "target": "runtime", "action": "hang", "methods": "a,,b,3"}, ""),
    ({"kind": "kill", "target": "pleg", "for": 3}, "a kill fault takes no 'for'"),
    ({"kind": "stop", "target": "pleg", "signal": "KILL"}, "a stop fault takes no 'signal'"),
])
def test_a_request_is_refused_with_the_reason(args: dict[str, Any], says: str) -> None:
    if not says:
        assert spec_from_args(args).methods == ("a", "b", "3")
        return
    with pytest.raises(FaultSpecError) as err:
        spec_from_args(args)
    assert says in str(err.value)


def test_specs_and_faults_in_force_round_trip_through_the_file(tmp_path: Path) -> None:
    specs = [spec_from_args({"kind": "bus", "target": "pleg", "action": "delay", "delay": 0.5,
                             "direction": "recv", "topics": ["clone.pleg."], "rate": 0.5,
                             "for": 30}),
             spec_from_args({"kind": "cri", "target": "runtime", "action": "error",
                             "code": "INTERNAL", "methods": ["ListContainers"]}),
             spec_from_args({"kind": "stop", "target": "prober", "for": 2})]
    assert specs[1] == FaultSpec("cri", "runtime", action="error", methods=("ListContainers",),
                                 code="INTERNAL")
    faults = [ActiveFault(f"f{i}", s, 100.0 + i, None if i == 1 else 200.0)
              for i, s in enumerate(specs)]
    path = tmp_path / "faults.json"
    write_faults(path, faults)
    assert read_faults(path) == tuple(faults)
    assert [f.spec.describe() for f in faults] == [
        "bus pleg: delay recv 0.5s topics clone.pleg. (50%)",
        "cri runtime: error INTERNAL on ListContainers", "stop prober: SIGSTOP"]
    path.write_text("{not json")
    assert read_faults(path) == ()
    assert read_faults(tmp_path / "missing.json") == ()


def test_the_gate_drops_delays_and_duplicates_by_direction_and_topic() -> None:
    clock = FakeClock(10.0)
    gate = BusGate(clock)
    assert gate.verdict("send", "pleg.pod.event").copies == 1
    gate.set_rules([FaultSpec("bus", "pleg", action="drop", direction="send",
                              topics=("clone.",)),
                    FaultSpec("bus", "pleg", action="duplicate", direction="recv"),
                    FaultSpec("bus", "pleg", action="delay", direction="both", delay=2.0,
                              topics=("pleg.",))])
    assert gate.verdict("send", "clone.pleg.update").copies == 0
    assert gate.verdict("send", "pleg.pod.event").delay == 2.0
    assert gate.verdict("send", "events.event.recorded") == Verdict()
    assert gate.verdict("recv", "clone.pleg.update").copies == 2
    assert (gate.verdict("recv", "pleg.pod.event").copies,
            gate.verdict("recv", "pleg.pod.event").delay) == (2, 2.0)
    sent: list[int] = []
    gate.hold(2.0, lambda: sent.append(1))
    gate.hold(0.5, lambda: sent.append(2))  # behind the first: order is kept
    assert gate.next_due() == 12.0
    clock.advance(1.0)
    assert gate.release(clock.monotonic()) == 0
    clock.advance(1.0)
    assert gate.release(clock.monotonic()) == 2 and sent == [1, 2]
    assert gate.counts["send.drop"] == 1 and gate.counts["recv.duplicate"] == 3


def test_real_sockets_drop_delay_and_duplicate(wait_for: Any) -> None:
    root = short_tmp_dir()
    paths = RunPaths(root)
    paths.ensure()
    zctx: zmq.Context[Any] = zmq.Context()
    proxy = BusProxy(zctx, paths)
    proxy.start()
    gate = BusGate(SYSTEM_CLOCK)
    pub = Publisher(zctx, paths, "a", gate=gate)
    plain = Subscriber(zctx, paths, [""])
    gated = Subscriber(zctx, paths, [""], gate=gate)
    try:
        def got(sub: Subscriber, n: int) -> list[Any]:
            out: list[Any] = []
            wait_for_impl(lambda: (out.extend(iter(lambda: sub.recv(0.05), None)) or
                                   len(out) >= n), 10, 0.01, f"{n} messages")
            return out

        wait_for(lambda: pub.publish(Probe(n=0)) and plain.recv(0.05) is not None)
        while gated.recv(0.1) is not None:
            pass
        gate.set_rules([FaultSpec("bus", "a", action="duplicate", direction="send")])
        pub.publish(Probe(n=1))
        assert [e.seq for e in got(plain, 2)] == [pub.seq, pub.seq]  # same sequence twice
        gate.set_rules([FaultSpec("bus", "a", action="drop", direction="send")])
        pub.publish(Probe(n=2))
        gate.set_rules([FaultSpec("bus", "a", action="delay", direction="send", delay=0.3)])
        pub.publish(Probe(n=3))
        assert plain.recv(0.1) is None  # held, not lost
        gate.release(SYSTEM_CLOCK.monotonic() + 1.0)
        [late] = got(plain, 1)
        assert late.message.n == 3
        assert late.seq == pub.seq  # "gone" used a sequence number: a receiver sees the gap
        gate.set_rules([FaultSpec("bus", "a", action="delay", direction="recv", delay=0.2)])
        while gated.recv(0.05) is not None:
            pass
        pub.publish(Probe(n=4))
        seen: list[Any] = []  # what the gated side had held before comes first, in order
        wait_for_impl(lambda: seen.extend(iter(lambda: gated.recv(0.05), None)) or
                      any(e.message.n == 4 for e in seen), 10, 0.01, "n=4, 0.2 s late")
        assert gate.counts["recv.delay"] >= 1
    finally:
        for sock in (pub, plain, gated):
            sock.close()
        proxy.stop()
        zctx.destroy(linger=0)


def test_a_watch_sees_only_the_faults_aimed_at_its_process(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    paths.ensure()
    watch = FaultWatch(paths, "pleg")
    assert watch.current == () and watch.fd is not None
    mine = ActiveFault("f1", FaultSpec("bus", "pleg", action="drop"), 1.0)
    other = ActiveFault("f2", FaultSpec("stop", "prober"), 1.0)
    write_faults(paths.faults_file, [mine, other])
    assert watch.changed() and watch.current == (mine,)
    write_faults(paths.faults_file, [other])
    assert watch.changed() and watch.current == ()
    assert not watch.changed()
    watch.close()


class _Proc:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.alive = True


class _Sup:
    """The two things the fault table asks of the supervisor."""

    def __init__(self) -> None:
        self.procs = {"pleg": _Proc(42)}
        self.signals: list[tuple[str, int]] = []

    def kill(self, name: str, sig: int) -> _Proc:
        self.signals.append((name, int(sig)))
        return self.procs[name]


def test_the_table_applies_expires_clears_and_records_each_start_and_end(
        tmp_path: Path) -> None:
    clock = FakeClock(50.0)
    sup = _Sup()
    events = EventStore(None, clock=clock.monotonic)
    path = tmp_path / "run" / "faults" / "faults.json"
    table = FaultTable(sup, path, events, MemoryLogger(), clock.monotonic,  # type: ignore[arg-type]
                       clock.wall)
    assert read_faults(path) == ()
    stop = table.inject(FaultSpec("stop", "pleg", duration=5.0))
    bus = table.inject(FaultSpec("bus", "pleg", action="drop"))
    table.inject(FaultSpec("kill", "pleg", signal="TERM"))
    assert [f.id for f in read_faults(path)] == ["f1", "f2"]  # the kill was instant
    assert sup.signals == [("pleg", signal.SIGSTOP), ("pleg", signal.SIGTERM)]
    assert table.next_expiry() == 55.0 and stop.expires == stop.started + 5.0
    clock.advance(5.0)
    assert [f.id for f in table.expire()] == ["f1"]
    assert sup.signals[-1] == ("pleg", signal.SIGCONT)
    assert [f.id for f in read_faults(path)] == [bus.id]
    assert [f.id for f in table.clear()] == ["f2"] and read_faults(path) == ()
    reasons = [(e["reason"], e["involvedObject"]["name"])
               for e in events.event_list()["items"]]
    assert sorted(reasons) == sorted([("FaultInjected", "f1"), ("FaultInjected", "f2"),
                                      ("FaultInjected", "f3"), ("FaultCleared", "f3"),
                                      ("FaultCleared", "f1"), ("FaultCleared", "f2")])
    messages = [e["message"] for e in events.event_list()["items"]]
    assert "f1 stop pleg: SIGSTOP: expired after 5.0s" in messages
    assert "f2 bus pleg: drop both: cleared after 5.0s" in messages
