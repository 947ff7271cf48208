"""The PLEG loop over a real bus (proxy, map replica, event subscriber) and the fake runtime."""

from __future__ import annotations

import os
import select
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import zmq
from cri_api.v1 import api_pb2 as pb

from podvisor.common.child import FakeChildContext
from podvisor.common.logs import MemoryLogger
from podvisor.ipc.bus import BusProxy, Publisher, Subscriber
from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.clone import MapReplica
from podvisor.ipc.maps import PLEG
from podvisor.ipc.messages import RelistHint
from podvisor.ipc.paths import RunPaths
from podvisor.services.cri.fake import FakeRuntimeClient
from podvisor.services.pleg import service as pleg_main
from podvisor.services.pleg.service import serve
from podvisor.services.pleg.stream import EventWatcher
from tests.conftest import wait_for_impl


def wait_for(cond: Callable[[], Any], timeout: float = 15.0,
             pump: Callable[[], Any] | None = None) -> Any:
    return wait_for_impl(cond, timeout, 0.01, pump=pump)


class Harness:
    def __init__(self, root: Path, client: FakeRuntimeClient) -> None:
        self.paths = RunPaths(root)
        self.paths.ensure()
        self.zctx: zmq.Context[Any] = zmq.Context()
        self.proxy = BusProxy(self.zctx, self.paths)
        self.proxy.start()
        self.client = client
        self.ctx = FakeChildContext(self.paths, "pleg", zctx=self.zctx)
        self.log = self.ctx.log
        self.replica = MapReplica(self.zctx, self.paths, PLEG, clock=SYSTEM_CLOCK)
        self.events = Subscriber(self.zctx, self.paths, ["pleg.pod.event"])
        self.seen: list[tuple[str, str, str]] = []
        self.thread = threading.Thread(target=serve, args=(self.ctx, client), daemon=True)
        self.thread.start()

    def pump(self) -> None:
        self.replica.pump(0.01)
        while (env := self.events.recv(0)) is not None:
            m = env.message
            self.seen.append((m.pod_uid, m.type, m.container_id))  # type: ignore[attr-defined]

    def health(self) -> dict[str, Any]:
        health = self.replica.get("_health")
        return health.to_wire() if health is not None else {}

    def close(self) -> None:
        self.ctx.stop.set()
        self.thread.join(10)
        self.replica.close()
        self.events.close()
        self.proxy.stop()
        self.zctx.destroy(linger=0)


@pytest.fixture
def harness() -> Iterator[Callable[[FakeRuntimeClient], Harness]]:
    made: list[Harness] = []
    root = Path(tempfile.mkdtemp(prefix="pvpleg", dir="/tmp"))

    def make(client: FakeRuntimeClient) -> Harness:
        h = Harness(root, client)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()
    shutil.rmtree(root, ignore_errors=True)


def add_pod(client: FakeRuntimeClient, uid: str) -> tuple[str, str]:
    lab = {"io.kubernetes.pod.uid": uid, "io.kubernetes.pod.name": "p",
           "io.kubernetes.pod.namespace": "default"}
    scfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p", uid=uid), labels=lab)
    sid = client.run_pod_sandbox(scfg)
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"),
                             image=pb.ImageSpec(image="host"),
                             labels={**lab, "io.kubernetes.container.name": "app"})
    cid = client.create_container(sid, cfg, scfg)
    client.start_container(cid)
    return sid, cid


def test_stream_mode_publishes_cache_and_events(harness: Any) -> None:
    client = FakeRuntimeClient()
    _sid, cid = add_pod(client, "u1")
    h: Harness = harness(client)
    wait_for(lambda: h.health().get("events_mode") == "stream", pump=h.pump)
    rec = wait_for(lambda: h.replica.get("u1"), pump=h.pump)
    assert rec.containers[0].state == "CONTAINER_RUNNING"
    # Events are hints on plain PUB/SUB: the first relist's may go out before the bus has the
    # test's subscription (slow joiner); the cache above came by snapshot. A pod started once
    # the stream is up must show its ContainerStarted.
    _sid2, cid2 = add_pod(client, "u2")
    wait_for(lambda: ("u2", "ContainerStarted", cid2) in h.seen, pump=h.pump)
    client.exit_container(cid, 1)
    wait_for(lambda: ("u1", "ContainerDied", cid) in h.seen, pump=h.pump)
    died = h.replica.get("u1").containers[0]
    assert died.state == "CONTAINER_EXITED" and died.exit_code == 1
    # the event ts never runs ahead of the replicated cache's global ts
    assert h.health()["ts"] >= rec.ts
    assert h.health()["last_relist_ok"] > 0 and h.health()["event_drops"] == 0


def test_unimplemented_stream_falls_back_to_relist(harness: Any) -> None:
    client = FakeRuntimeClient()
    client.fail("GetContainerEvents", grpc.StatusCode.UNIMPLEMENTED)
    _sid, cid = add_pod(client, "u1")
    h: Harness = harness(client)
    wait_for(lambda: h.health().get("events_mode") == "relist"
             and h.health().get("relists", 0) >= 2, pump=h.pump)
    client.exit_container(cid, 0)
    wait_for(lambda: ("u1", "ContainerDied", cid) in h.seen, pump=h.pump)
    assert h.log.named("pleg.events_unsupported")


def test_stream_disconnect_relists_and_reconnects(harness: Any) -> None:
    client = FakeRuntimeClient()
    add_pod(client, "u1")
    h: Harness = harness(client)
    wait_for(lambda: h.health().get("events_mode") == "stream", pump=h.pump)
    client.streams[0].close()
    wait_for(lambda: h.log.named("pleg.events_stream_ended"), pump=h.pump)
    wait_for(lambda: len(client.streams) >= 2 and h.log.named("pleg.events_mode")[-1]["mode"]
             == "stream", pump=h.pump)


def test_runtime_down_keeps_loop_alive_then_recovers(harness: Any) -> None:
    client = FakeRuntimeClient()
    client.fail("ListPodSandbox", grpc.StatusCode.UNAVAILABLE)
    add_pod(client, "u1")
    beats: list[float] = []
    h: Harness = harness(client)
    h.ctx.beat = lambda: beats.append(time.monotonic())
    wait_for(lambda: h.log.named("pleg.relist_failed") and len(beats) > 3, pump=h.pump)
    assert h.replica.get("u1") is None
    client.clear_failures()
    wait_for(lambda: h.replica.get("u1"), pump=h.pump)
    assert h.log.named("pleg.relist_recovered")


PLEG_CALLS = ("ListPodSandbox", "ListContainers", "ContainerStatus", "PodSandboxStatus")


def pleg_calls(client: FakeRuntimeClient) -> int:
    return sum(len(client.method_calls(m)) for m in PLEG_CALLS)


def stream_settled(h: Harness) -> bool:
    # one relist at start and one when the stream connected, in either order
    return h.health().get("events_mode") == "stream" and h.health().get("relists", 0) >= 2


def test_stream_events_update_the_cache_without_cri_calls(harness: Any) -> None:
    client = FakeRuntimeClient()
    sid, cid = add_pod(client, "u1")
    h: Harness = harness(client)
    wait_for(lambda: stream_settled(h) and h.replica.get("u1"), pump=h.pump)
    calls, health = pleg_calls(client), h.health()
    # a restart as the sync loop does it: death, new container, start, removal of the old one
    client.exit_container(cid, 137)
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app", attempt=1),
                             image=pb.ImageSpec(image="host"),
                             labels={"io.kubernetes.pod.uid": "u1"})
    new = client.create_container(sid, cfg, pb.PodSandboxConfig())
    client.start_container(new)
    client.remove_container(cid)
    wait_for(lambda: ("u1", "ContainerRemoved", cid) in h.seen, pump=h.pump)
    wait_for(lambda: ("u1", "ContainerStarted", new) in h.seen, pump=h.pump)
    first = ("u1", "ContainerStarted", cid)  # the first relist's (if it was subscribed yet)
    assert [e for e in h.seen if e[2] == cid and e != first] == [
        ("u1", "ContainerDied", cid), ("u1", "ContainerRemoved", cid)]
    # ContainerChanged (CREATED) only if the start came after the hold (batching decides)
    assert {e[1] for e in h.seen if e[2] == new} - {"ContainerChanged"} == {"ContainerStarted"}
    wait_for(lambda: [(c.id, c.state) for c in h.replica.get("u1").containers]
             == [(new, "CONTAINER_RUNNING")], pump=h.pump)
    assert pleg_calls(client) == calls  # not one CRI call
    assert h.health() == health  # `_health` is the relists' alone


def test_dropped_events_make_pleg_relist(harness: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    class Lossy(EventWatcher):
        lose = 0

        def _put(self, item: Any) -> None:
            if item is not None and self.lose:
                self.lose -= 1
                self.dropped += 1
                self._wake()
                return
            super()._put(item)

    watchers: list[Lossy] = []

    def make(*args: Any, **kwargs: Any) -> Lossy:
        watchers.append(Lossy(*args, **kwargs))
        return watchers[-1]

    monkeypatch.setattr(pleg_main, "EventWatcher", make)
    client = FakeRuntimeClient()
    _sid, cid = add_pod(client, "u1")
    h: Harness = harness(client)
    wait_for(lambda: stream_settled(h), pump=h.pump)
    relists = h.health()["relists"]
    watchers[0].lose = 1
    client.exit_container(cid, 2)  # its event is lost: the relist finds the death
    wait_for(lambda: ("u1", "ContainerDied", cid) in h.seen, pump=h.pump)
    health = wait_for(lambda: h.health().get("stream_drops") and h.health(), pump=h.pump)
    assert health["relists"] == relists + 1 and health["stream_drops"] == 1
    assert h.replica.get("u1").containers[0].exit_code == 2


def test_stream_fallback_period_is_slow_but_within_healthz_threshold() -> None:
    from podvisor.common.podlist import PLEG_HEALTHY_WITHIN
    assert pleg_main.RELIST_PERIOD == 1.0
    assert 30.0 <= pleg_main.STREAM_RELIST_PERIOD <= PLEG_HEALTHY_WITHIN / 3


def test_a_container_left_created_is_published_after_the_hold(harness: Any) -> None:
    client = FakeRuntimeClient()
    sid, _cid = add_pod(client, "u1")
    h: Harness = harness(client)
    wait_for(lambda: stream_settled(h), pump=h.pump)
    relists = h.health()["relists"]
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="side"),
                             image=pb.ImageSpec(image="host"),
                             labels={"io.kubernetes.pod.uid": "u1"})
    new = client.create_container(sid, cfg, pb.PodSandboxConfig())  # never started
    wait_for(lambda: ("u1", "ContainerChanged", new) in h.seen, pump=h.pump)
    wait_for(lambda: [c.state for c in h.replica.get("u1").containers
                      if c.id == new] == ["CONTAINER_CREATED"], pump=h.pump)
    assert h.health()["relists"] == relists  # the hold ended it, not a relist


def test_watcher_wakes_once_per_drain_and_bounds_its_queue() -> None:
    """A burst of events writes the wake pipe once until the loop drains; an event after the
    drain wakes it again; past ``maxsize`` events are dropped and counted, never blocked on."""
    watcher = EventWatcher(FakeRuntimeClient(), MemoryLogger(), maxsize=3)
    try:
        def pending() -> bytes:
            if not select.select([watcher.wake_fd], [], [], 0)[0]:
                return b""
            return os.read(watcher.wake_fd, 4096)

        for i in range(5):
            watcher._put(i)
        assert watcher.dropped == 2
        assert pending() == b"x"  # one write for the burst (read here, as a drain would)
        assert watcher.drain() == [0, 1, 2] and pending() == b""
        watcher._put(5)
        assert pending() == b"x" and watcher.drain() == [5]
        assert watcher.drain() == [] and pending() == b""
    finally:
        watcher.stop()


def test_the_watcher_streams_only_once_the_runtime_took_the_subscription() -> None:
    """``streaming`` (the loop relists once, then trusts events) waits for the runtime's
    headers: a relist before the subscription exists would miss the events in between."""
    client = FakeRuntimeClient()
    client.hold_subscriptions = True
    watcher = EventWatcher(client, MemoryLogger())
    watcher.start()
    try:
        wait_for(lambda: client.streams)
        assert not watcher.streaming and watcher.drain() == []  # asked, not yet subscribed
        client.streams[0].subscribed.set()
        wait_for(lambda: watcher.streaming)
        assert watcher.drain() == [None]  # the mode change: relist now
    finally:
        watcher.stop()


def test_an_event_put_while_the_loop_drains_still_wakes_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The producer may put (and write the pipe) while ``drain`` reads it: whatever the
    interleaving, the next event after the drain makes the pipe readable again."""
    watcher = EventWatcher(FakeRuntimeClient(), MemoryLogger())
    real_read = os.read
    raced: list[bool] = []

    def racing_read(fd: int, n: int) -> bytes:
        if fd == watcher.wake_fd and not raced:
            raced.append(True)
            watcher._put("during")  # the producer, between the drain's steps
        return real_read(fd, n)

    try:
        watcher._put("before")
        monkeypatch.setattr(os, "read", racing_read)
        assert watcher.drain() == ["before", "during"]
        monkeypatch.setattr(os, "read", real_read)
        watcher._put("after")
        assert select.select([watcher.wake_fd], [], [], 0)[0]
        assert watcher.drain() == ["after"]
    finally:
        watcher.stop()


def batch_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each batch of events the PLEG loop applies, appended as it applies them."""
    batches: list[int] = []
    apply = pleg_main.PlegLoop.apply

    def counting(self: pleg_main.PlegLoop, events: list[Any]) -> Any:
        batches.append(len(events))
        return apply(self, events)

    monkeypatch.setattr(pleg_main.PlegLoop, "apply", counting)
    return batches


def test_a_burst_of_events_is_applied_in_batches(
        harness: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a burst the loop leaves the wake fd unpolled for EVENTS_COALESCE after applying
    events: the events that follow are applied together, and none is lost meanwhile."""
    monkeypatch.setattr(pleg_main, "EVENTS_COALESCE", 0.5)
    monkeypatch.setattr(pleg_main, "BURST_GAP", 1.0)
    monkeypatch.setattr(pleg_main, "BURST_EVENTS", 2)
    batches = batch_sizes(monkeypatch)
    client = FakeRuntimeClient()
    h: Harness = harness(client)
    wait_for(lambda: stream_settled(h), pump=h.pump)
    _sid, first = add_pod(client, "u0")
    wait_for(lambda: ("u0", "ContainerStarted", first) in h.seen, pump=h.pump)
    applied = len(batches)
    started = []
    for i in range(1, 6):  # a burst's shape: a pod every 20 ms (not a wait for anything)
        started.append(add_pod(client, f"u{i}")[1])
        time.sleep(0.02)
    for i, cid in enumerate(started, 1):
        wait_for(lambda i=i, cid=cid: (f"u{i}", "ContainerStarted", cid) in h.seen,
                 pump=h.pump)
    assert sum(batches[applied:]) == 10  # create + start of each pod, every one applied
    # one wake-up per window, not one per pod (one or two windows; three on a slow machine)
    assert len(batches) - applied <= 3


def test_a_lone_pods_create_and_start_are_not_held_back(
        harness: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Coalescing starts with a burst (BURST_EVENTS events within BURST_GAP): a pod created,
    then started after its create was applied, is published at once, not a window later."""
    monkeypatch.setattr(pleg_main, "EVENTS_COALESCE", 3600.0)  # a window would fail the test
    monkeypatch.setattr(pleg_main, "BURST_GAP", 0.5)
    batches = batch_sizes(monkeypatch)
    client = FakeRuntimeClient()
    h: Harness = harness(client)
    wait_for(lambda: stream_settled(h), pump=h.pump)
    lab = {"io.kubernetes.pod.uid": "u1", "io.kubernetes.pod.name": "p",
           "io.kubernetes.pod.namespace": "default"}
    scfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p", uid="u1"), labels=lab)
    sid = client.run_pod_sandbox(scfg)
    cid = client.create_container(sid, pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="app"), image=pb.ImageSpec(image="host"),
        labels={**lab, "io.kubernetes.container.name": "app"}), scfg)
    wait_for(lambda: sum(batches) == 1)  # the create is applied (and held)
    client.start_container(cid)  # its own batch, right after the create's
    wait_for(lambda: ("u1", "ContainerStarted", cid) in h.seen, pump=h.pump)
    assert batches == [1, 1]


def test_relist_hint_relists_at_once_without_a_stream(
        harness: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No event stream (containerd 1.6): the sync loop's RelistHint makes PLEG relist now, not
    at its next period (made 60 s here, so only the hint can explain the event)."""
    monkeypatch.setattr(pleg_main, "RELIST_PERIOD", 60.0)
    client = FakeRuntimeClient()
    client.fail("GetContainerEvents", grpc.StatusCode.UNIMPLEMENTED)
    h: Harness = harness(client)
    wait_for(lambda: h.health().get("events_mode") == "relist", pump=h.pump)
    relists = h.health()["relists"]
    _sid, cid = add_pod(client, "u1")
    pub = Publisher(h.zctx, h.paths, "syncloop")

    def hint() -> None:  # again until heard: the first may beat the subscription (slow joiner)
        pub.publish(RelistHint(ts=time.monotonic()))
        h.pump()
    try:
        wait_for(lambda: ("u1", "ContainerStarted", cid) in h.seen, timeout=30.0, pump=hint)
    finally:
        pub.close()
    # the relist's _health (its count) is published beside the event: it may come a turn later
    wait_for(lambda: h.health()["relists"] > relists, pump=h.pump)


def test_hinted_relists_are_bounded_by_the_relist_duty() -> None:
    assert pleg_main.hint_gap(0.0) == pleg_main.HINT_MIN_GAP
    assert pleg_main.hint_gap(0.05) == pytest.approx(pleg_main.HINT_DUTY * 0.05)
