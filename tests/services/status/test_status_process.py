"""StatusService over a real bus (proxy, owners of ``desired`` and ``pleg`` in the test): what
it publishes is on disk first, and a service killed at any point (no close, no final save) is
replaced by one that publishes the same statuses at once and never goes back."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from podvisor.common import FakeClock
from podvisor.common.child import FakeChildContext
from podvisor.common.logs import MemoryLogger
from podvisor.ipc.clone import MapReplica
from podvisor.ipc.maps import STATUSES, ContainerWaiting, DesiredPod, PlegHealth, PlegPod
from podvisor.services.pod import pod_from_dict
from podvisor.services.status.engine import RETIRE_AFTER
from podvisor.services.status.service import COALESCE, SWEEP_PERIOD, StatusService
from podvisor.services.status.store import Saved, StatusStore
from tests.conftest import MapBus
from tests.support.plegs import pleg_pod

NS = 1_000_000_000
WALL = 1_700_000_000.0


def entry(uid: str) -> DesiredPod:
    pod = pod_from_dict({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": uid, "namespace": "default", "uid": uid},
                         "spec": {"containers": [{"name": "app", "image": "host"}]}}).pod
    return DesiredPod(pod=pod.to_dict(), source="file", worker="syncing")


def record(cid: str, running: bool) -> PlegPod:
    return pleg_pod(ts=1.0, sandboxes=[{"id": "sb", "state": "SANDBOX_READY", "created_at": NS,
                                        "attempt": 0, "ip": ""}],
                    containers=[{"id": cid, "name": "app", "sandbox_id": "sb", "attempt": 0,
                                 "state": "CONTAINER_RUNNING" if running else "CONTAINER_CREATED",
                                 "created_at": NS, "started_at": 2 * NS if running else 0,
                                 "finished_at": 0, "exit_code": 0, "restart_count": 0}])


class Bus(MapBus):
    def __init__(self, root: Path) -> None:
        # one fake clock for the whole object graph: the service, its owner and replicas, and
        # the test's owners (the machine's uptime never matters)
        self.clock: FakeClock = FakeClock(1000.0, WALL)
        super().__init__(root, ("desired", "pleg", "probes"), clock=self.clock)  # no probes: empty
        self.desired, self.pleg, self.probes = (self.maps[m] for m in ("desired", "pleg", "probes"))
        self.relists = 0
        self.ctx = FakeChildContext(self.paths, "status", zctx=self.zctx, clock=self.clock)
        self.log = self.ctx.log

    def relist(self, **records: PlegPod) -> None:
        """A PLEG relist "now" (the service's monotonic clock does not move)."""
        self.relists += 1
        for uid, rec in records.items():
            self.pleg.set(uid, dataclasses.replace(rec, ts=self.clock.now))
        self.pleg.set("_health", PlegHealth(ts=self.clock.now, last_relist_ok=self.clock.wall_now,
                                            relists=self.relists))

    def service(self) -> StatusService:
        return StatusService(self.ctx)

    def turn(self, svc: StatusService) -> None:
        """One loop turn of the service, with the test's owners answering snapshots; the
        service's clock moves by ``COALESCE`` per turn (computes are that far apart)."""
        self.clock.now += COALESCE
        for owner in (self.desired, self.pleg, self.probes):
            owner.serve()
        for replica in (svc.desired, svc.pleg, svc.probes):
            replica.pump(0.01)
        svc.step()
        svc.owner.serve()
        published = svc.owner.items()
        on_disk = svc.store.load().statuses
        assert all(on_disk[uid] == st for uid, st in published.items()
                   if uid in on_disk) and on_disk.keys() >= published.keys(), \
            "a published status is not on disk"


def kill(svc: StatusService) -> None:
    """What kill -9 leaves: sockets gone, no final commit."""
    for closable in (svc.desired, svc.pleg, svc.probes, svc.owner, svc.pub):
        closable.close()


def run_until(bus: Bus, svc: StatusService, cond: Callable[[], Any], timeout: float = 10.0
              ) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        bus.turn(svc)
    return value


@pytest.fixture
def bus() -> Iterator[Bus]:
    root = Path(tempfile.mkdtemp(prefix="pvst", dir="/tmp"))
    b = Bus(root)
    yield b
    b.close()
    shutil.rmtree(root, ignore_errors=True)


def on_disk(svc: StatusService) -> Saved:
    return StatusStore(svc.store.path, MemoryLogger()).load()


def ready(svc: StatusService, uid: str) -> bool:
    value = svc.owner.get(uid)
    cond = value.status.condition("Ready") if value is not None else None
    return cond is not None and cond.true


def test_changes_are_durable_before_they_are_published(bus: Bus) -> None:
    svc = bus.service()
    bus.desired.set("u1", entry("u1"))
    bus.relist(u1=record("c1", running=False))
    run_until(bus, svc, lambda: svc.owner.get("u1"))
    first_commit, appends = svc.store.writes, svc.store.appends
    # A change is committed (written, then published) in the turn that computed it: one
    # journal line (bus.turn checks disk before readers).
    bus.relist(u1=record("c1", running=True))
    run_until(bus, svc, lambda: ready(svc, "u1"))
    assert svc.owner.get("u1").version == 2
    assert svc.store.writes == first_commit + 1
    assert svc.store.appends == appends + 1
    kill(svc)


def test_a_burst_within_the_coalescing_window_is_one_compute_and_one_commit(bus: Bus) -> None:
    svc = bus.service()
    for uid in ("u1", "u2"):
        bus.desired.set(uid, entry(uid))
    bus.relist(u1=record("c1", False), u2=record("c2", False))
    run_until(bus, svc, lambda: svc.owner.get("u2"))
    writes = svc.store.writes
    # the clock stands still: u1 starts, u2 starts; both arrive within one window
    def arrived(uid: str) -> None:
        deadline = time.monotonic() + 10
        while svc.pleg.get(uid) is None \
                or svc.pleg.get(uid).containers[0].state != "CONTAINER_RUNNING":
            assert time.monotonic() < deadline, "update not received"
            svc.pleg.pump(0.01)

    bus.relist(u1=record("c1", True))
    arrived("u1")
    svc.step()  # inside the window of the last compute: nothing computed yet
    assert not ready(svc, "u1") and svc.store.writes == writes
    assert 0 < svc.poll_timeout() <= COALESCE
    bus.relist(u2=record("c2", True))
    arrived("u2")
    run_until(bus, svc, lambda: ready(svc, "u1") and ready(svc, "u2"))
    assert svc.store.writes == writes + 1  # one commit for both pods
    assert svc.owner.get("u1").version == svc.owner.get("u2").version == 2
    kill(svc)


def test_killed_service_is_replaced_without_going_back(bus: Bus) -> None:
    svc = bus.service()
    for uid in ("u1", "u2"):
        bus.desired.set(uid, entry(uid))
    bus.relist(u1=record("c1", False), u2=record("c2", False))
    run_until(bus, svc, lambda: svc.owner.get("u2"))
    bus.clock.wall_now += 1
    bus.relist(u1=record("c1", True), u2=record("c2", True))
    run_until(bus, svc, lambda: ready(svc, "u1") and ready(svc, "u2"))
    published = svc.owner.items()
    kill(svc)

    again = bus.service()
    assert again.owner.items() == published  # at once, before any replica synced
    reader = MapReplica(bus.zctx, bus.paths, STATUSES, clock=bus.clock)
    try:
        run_until(bus, again, lambda: again.owner.serve() >= 0 and reader.sync(0.2))
        assert reader.items() == published
    finally:
        reader.close()
    bus.clock.wall_now += 100  # recomputed much later: same transition times and versions
    bus.relist(u1=record("c1", True), u2=record("c2", True))
    run_until(bus, again, lambda: any(e.get("event") == "status.inputs"
                                      for e in bus.log.events[-5:]))
    assert again.owner.items() == published
    kill(again)


def test_sweep_expires_retired_statuses_without_recomputing_every_pod(bus: Bus) -> None:
    svc = bus.service()
    for uid in ("u1", "u2"):
        bus.desired.set(uid, entry(uid))
    bus.relist(u1=record("c1", True), u2=record("c2", True))
    run_until(bus, svc, lambda: ready(svc, "u1") and ready(svc, "u2"))
    bus.desired.delete("u2")
    run_until(bus, svc, lambda: "u2" in svc.engine.retired)
    assert "u2" in on_disk(svc).retired  # kept on disk while retired
    computed = svc.engine.reconcile
    calls: list[object] = []
    svc.engine.reconcile = lambda *a, **k: calls.append(a) or computed(*a, **k)  # type: ignore
    bus.clock.wall_now += RETIRE_AFTER + 1
    bus.clock.now += SWEEP_PERIOD
    bus.turn(svc)
    assert "u2" not in svc.engine.retired and "u2" not in on_disk(svc).retired
    assert calls == [] and ready(svc, "u1")  # nothing recomputed
    kill(svc)


def test_a_change_that_cannot_be_computed_yet_is_waited_for_not_polled(bus: Bus) -> None:
    svc = bus.service()
    bus.desired.set("u1", entry("u1"))
    bus.pleg.set("u1", record("c1", True))  # no `_health` yet: PLEG has not relisted
    run_until(bus, svc, lambda: svc.desired.synced and svc.pleg.synced and svc.probes.synced)
    bus.turn(svc)
    assert svc.owner.get("u1") is None  # not computable
    svc.owner.next_tick = lambda: float("inf")  # type: ignore[method-assign]  # not checked here
    assert svc.poll_timeout() == bus.ctx.heartbeat_interval  # no busy loop meanwhile
    bus.relist()
    run_until(bus, svc, lambda: ready(svc, "u1"))
    kill(svc)


def test_a_desired_change_a_status_does_not_read_recomputes_nothing(bus: Bus) -> None:
    svc = bus.service()
    bus.desired.set("u1", entry("u1"))
    bus.relist(u1=record("c1", True))
    run_until(bus, svc, lambda: ready(svc, "u1"))
    computed = svc.engine.reconcile
    calls: list[object] = []
    svc.engine.reconcile = lambda *a, **k: calls.append(a) or computed(*a, **k)  # type: ignore
    # the sync loop records its sandbox and a new worker state: nothing a status reads
    bus.desired.set("u1", replace(entry("u1"), sandbox_id="sb", updated_at=5.0,
                                  worker="running"))
    run_until(bus, svc, lambda: svc.desired.get("u1").sandbox_id == "sb")
    for _ in range(3):
        bus.turn(svc)
    assert calls == [] and not svc._changed
    # a waiting reason is read: recomputed
    bus.desired.set("u1", replace(entry("u1"), sandbox_id="sb", waiting={"app": ContainerWaiting(
        "CrashLoopBackOff", "back-off")}))
    run_until(bus, svc, lambda: calls)
    kill(svc)


def test_condition_transitions_are_one_debug_line_per_pod(bus: Bus) -> None:
    config = bus.ctx.config
    bus.ctx.config = replace(config, supervision=replace(config.supervision, log_level="debug"))
    svc = bus.service()
    bus.desired.set("u1", entry("u1"))
    bus.relist(u1=record("c1", False))
    run_until(bus, svc, lambda: svc.owner.get("u1"))
    bus.relist(u1=record("c1", True))
    run_until(bus, svc, lambda: ready(svc, "u1"))
    lines = [e for e in bus.log.events if e["event"].startswith("status.pod.condition")]
    assert [e["level"] for e in lines] == ["debug", "debug"]
    assert lines[0]["new"]["Ready"] == "False" and lines[0]["old"]["Ready"] is None
    assert lines[1]["new"] == {"Ready": "True", "ContainersReady": "True"}
    assert lines[1]["old"] == {"Ready": "False", "ContainersReady": "False"}
    kill(svc)


def test_at_info_level_no_transition_is_even_computed(bus: Bus) -> None:
    svc = bus.service()
    assert not svc.engine.log_transitions
    bus.desired.set("u1", entry("u1"))
    bus.relist(u1=record("c1", True))
    run_until(bus, svc, lambda: ready(svc, "u1"))
    assert not any(e["event"].startswith("status.pod.condition") for e in bus.log.events)
    kill(svc)


def test_replica_traffic_waits_in_zmq_while_nothing_can_be_computed(bus: Bus) -> None:
    svc = bus.service()
    bus.desired.set("u1", entry("u1"))
    bus.relist(u1=record("c1", True))
    run_until(bus, svc, lambda: ready(svc, "u1"))  # computed at the service's "now"

    def watched_after_a_turn() -> set[object]:
        """One turn of the service's loop (its poll returns at once: the clock stands still
        within the window, so the wait is at most COALESCE of real time)."""
        svc.loop.turn(svc.turn)
        return {s for s, _ in svc.loop.poller.sockets}

    watched = watched_after_a_turn()
    assert svc.loop.holding
    assert svc.owner.socket in watched  # snapshots are still answered
    assert not watched & {*svc.desired.sockets, *svc.pleg.sockets, *svc.probes.sockets}
    bus.clock.now += COALESCE  # the window is over: every socket again
    assert svc.desired.socket in watched_after_a_turn()
    kill(svc)
