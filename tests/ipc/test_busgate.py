"""The bus gate (ipc/busgate.py, issue 28): drop, delay and duplicate by direction and topic, on
a fake clock and then on real sockets through a real proxy."""

from __future__ import annotations

from typing import Any

import zmq

from podvisor.ipc.bus import BusProxy, Publisher, Subscriber
from podvisor.ipc.busgate import BusGate, Verdict
from podvisor.ipc.clock import SYSTEM_CLOCK, FakeClock
from podvisor.ipc.faults import FaultSpec
from podvisor.ipc.messages import Probe
from podvisor.ipc.paths import RunPaths
from tests.conftest import short_tmp_dir, wait_for_impl


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
