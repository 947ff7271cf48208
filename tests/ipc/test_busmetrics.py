"""The bus counters: what Publisher/Subscriber/MapReplica count becomes
podvisor_bus_messages_total and podvisor_bus_dropped_total{reason} (common/busmetrics.py), and a
service loop tallies what it declares. Real sockets over the bus proxy."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from podvisor.common import FakeClock
from podvisor.common.busmetrics import BusTally, bus_counters, new_bus_counters
from podvisor.common.child import FakeChildContext
from podvisor.common.service import ServiceLoop
from podvisor.ipc.bus import Publisher, Subscriber
from podvisor.ipc.codec import REASONS
from podvisor.ipc.maps import MapSpec, MapValueError
from podvisor.ipc.messages import RelistHint
from tests.conftest import MapBus


@pytest.fixture
def mapbus() -> Iterator[MapBus]:
    root = Path(tempfile.mkdtemp(prefix="pvbm", dir="/tmp"))
    b = MapBus(root, (INTS,))
    yield b
    b.close()
    shutil.rmtree(root, ignore_errors=True)


def _value(counters: Any, name: str, **labels: str) -> float:
    got = counters.registry.get_sample_value(name, labels or None)
    return 0.0 if got is None else float(got)


def _receive(sub: Subscriber, n: int, raw: zmq.Socket[bytes], pub: Publisher) -> None:
    """Publish (and inject a malformed frame) until ``sub`` took ``n`` good messages (a slow
    joiner loses the first ones: keep sending)."""
    deadline = time.monotonic() + 30.0
    while sub.received < n or not sub.drops:
        assert time.monotonic() < deadline, "nothing received over the bus"
        pub.publish(RelistHint(ts=1.0))
        raw.send(RelistHint.TOPIC.encode() + b" no envelope here")
        sub.recv(0.05)


def test_tally_adds_only_the_growth_and_every_reason_shows(mapbus: MapBus) -> None:
    counters = new_bus_counters()
    for reason in (*REASONS, "hwm"):
        assert counters.registry.get_sample_value("podvisor_bus_dropped_total",
                                                  {"reason": reason}) == 0
    sub = Subscriber(mapbus.zctx, mapbus.paths, [RelistHint.TOPIC])
    raw = mapbus.zctx.socket(zmq.PUB)
    raw.connect(mapbus.paths.bus_pub)
    tally = BusTally(counters)
    tally.receiving(sub)
    tally.publishing(mapbus.pub)
    try:
        _receive(sub, 3, raw, mapbus.pub)
        tally.flush()
        first = _value(counters, "podvisor_bus_messages_total")
        assert first == sub.received >= 3
        assert _value(counters, "podvisor_bus_dropped_total", reason="malformed") \
            == sub.drops["malformed"] >= 1
        tally.flush()  # nothing new: nothing added
        assert _value(counters, "podvisor_bus_messages_total") == first
        mapbus.pub.dropped += 2  # (what a full send queue does)
        _receive(sub, sub.received + 1, raw, mapbus.pub)
        tally.flush()
        assert _value(counters, "podvisor_bus_messages_total") == sub.received > first
        assert _value(counters, "podvisor_bus_dropped_total", reason="hwm") == 2
    finally:
        sub.close()
        raw.close(linger=0)


def test_the_service_loop_tallies_its_publishers_subscribers_and_replicas(
        mapbus: MapBus) -> None:
    clock = FakeClock(1000.0, 1_700_000_000.0)
    ctx = FakeChildContext(mapbus.paths, "t", zctx=mapbus.zctx, clock=clock)
    loop = ServiceLoop(ctx)
    counters = bus_counters()  # the process's pair
    before = _value(counters, "podvisor_bus_messages_total")
    drops_before = _value(counters, "podvisor_bus_dropped_total", reason="fields")
    replica = loop.replica(INTS)
    mapbus.maps["m"].set("good", 1)
    mapbus.maps["m"].set("bad", "not an int")
    try:
        deadline = time.monotonic() + 30.0
        while replica.received < 2 or not replica.synced or replica.get("good") != 1:
            assert time.monotonic() < deadline, "the replica never synced"
            mapbus.serve()
            loop.poll(0.05)
        loop.flush_bus(force=True)
        assert _value(counters, "podvisor_bus_messages_total") - before >= replica.received
        assert replica.value_drops["fields"] >= 1
        assert _value(counters, "podvisor_bus_dropped_total", reason="fields") > drops_before
    finally:
        loop.close()


def _only_ints(raw: Any) -> int:
    if not isinstance(raw, int):
        raise MapValueError("fields", "not an int")
    return raw


def _plain(value: Any) -> Any:
    return value


INTS: MapSpec[int] = MapSpec("m", _plain, _only_ints)  # a test map of ints
