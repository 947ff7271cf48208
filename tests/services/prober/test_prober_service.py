"""ProberService over a real bus (proxy and the ``desired`` / ``pleg`` owners in the test): it
updates its workers only for changes that concern pods with probes."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from podvisor.common import FakeClock
from podvisor.common.child import FakeChildContext
from podvisor.ipc.maps import DesiredPod, PlegHealth, PlegPod
from podvisor.services.pod import pod_from_dict
from podvisor.services.prober.handlers import FakeRunner
from podvisor.services.prober.service import HOLD, ProberService
from podvisor.services.prober.worker import Kind
from tests.conftest import MapBus
from tests.support.plegs import pleg_pod

NS = 1_000_000_000


def entry(uid: str, probes: bool, **extra: Any) -> DesiredPod:
    container: dict[str, Any] = {"name": "app", "image": "host"}
    if probes:
        container["readinessProbe"] = {"exec": {"command": ["true"]}, "periodSeconds": 60}
    pod = pod_from_dict({"apiVersion": "v1", "kind": "Pod",  # validated once, by its source
                         "metadata": {"name": uid, "namespace": "default", "uid": uid},
                         "spec": {"containers": [container], "hostNetwork": True}}).pod
    return DesiredPod(pod=pod.to_dict(), worker="syncing", **extra)


def record(cid: str, state: str = "CONTAINER_RUNNING") -> PlegPod:
    return pleg_pod(sandboxes=[{"id": "sb", "state": "SANDBOX_READY", "ip": ""}],
                    containers=[{"id": cid, "name": "app", "state": state, "created_at": NS,
                                 "started_at": 2 * NS}])


class Bus(MapBus):
    def __init__(self, root: Path) -> None:
        super().__init__(root, ("desired", "pleg"))
        self.desired, self.pleg = self.maps["desired"], self.maps["pleg"]
        self.ctx = FakeChildContext(self.paths, "prober", zctx=self.zctx)

    def turn(self, svc: ProberService) -> None:
        for owner in (self.desired, self.pleg):
            owner.serve()
        for replica in (svc.desired, svc.pleg):
            replica.pump(0.01)
        svc.step()
        svc.owner.serve()


@pytest.fixture
def bus() -> Iterator[Bus]:
    root = Path(tempfile.mkdtemp(prefix="pvpr", dir="/tmp"))
    b = Bus(root)
    yield b
    b.close()
    shutil.rmtree(root, ignore_errors=True)


def run_until(bus: Bus, svc: ProberService, cond: Callable[[], Any], timeout: float = 10.0
              ) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, "condition not met in time"
        bus.turn(svc)
    return value


def close(svc: ProberService) -> None:
    svc.pool.shutdown(wait=True)
    svc.loop.close()
    svc.wake.close()


def test_only_changes_of_pods_with_probes_update_the_workers(bus: Bus) -> None:
    bus.desired.set("plain", entry("plain", probes=False))
    bus.desired.set("probed", entry("probed", probes=True))
    bus.pleg.set("plain", record("c1"))
    bus.pleg.set("probed", record("c2"))
    bus.pleg.set("_health", PlegHealth(ts=1.0))
    svc = ProberService(bus.ctx, FakeRunner())
    try:
        run_until(bus, svc, lambda: svc.ready)
        worker = svc.manager.workers[("probed", "app", Kind.READINESS)]
        assert set(svc.manager.workers) == {("probed", "app", Kind.READINESS)}
        real = svc.manager.update
        updates: list[Any] = []
        svc.manager.update = (  # type: ignore[method-assign]
            lambda d, p, now, wall, only=None: updates.append(only) or real(d, p, now, wall, only))
        # the probe-less pod starts a new container; the sync loop notes a sandbox of each pod
        bus.pleg.set("plain", record("c3"))
        bus.desired.set("plain", entry("plain", probes=False, sandbox_id="sb"))
        bus.desired.set("probed", entry("probed", probes=True, sandbox_id="sb"))
        run_until(bus, svc, lambda: updates)
        assert updates == [{"probed"}]
        assert svc.manager.workers[("probed", "app", Kind.READINESS)] is worker  # not restarted
        # a new container of the probed pod: its worker follows
        bus.pleg.set("probed", record("c4"))
        run_until(bus, svc, lambda: worker.container_id == "c4")
        assert updates[-1] == {"probed"}
        # a probe appears on the plain pod: it gets a worker
        bus.desired.set("plain", entry("plain", probes=True))
        run_until(bus, svc, lambda: ("plain", "app", Kind.READINESS) in svc.manager.workers)
    finally:
        close(svc)


def test_a_malformed_desired_pod_is_logged_and_the_others_go_on(bus: Bus) -> None:
    bus.desired.set("probed", entry("probed", probes=True))
    broken = entry("broken", probes=True)
    bus.desired.set("broken", dataclasses.replace(broken, pod={**broken.pod, "spec": {
        "containers": [{"name": "app", "readinessProbe": {"exec": {}}}]}}))
    for uid, cid in (("probed", "c1"), ("broken", "c2")):
        bus.pleg.set(uid, record(cid))
    bus.pleg.set("_health", PlegHealth(ts=1.0))
    svc = ProberService(bus.ctx, FakeRunner())
    try:
        run_until(bus, svc, lambda: svc.ready)
        assert set(svc.manager.workers) == {("probed", "app", Kind.READINESS)}
        log = bus.ctx.log.events
        bad = [e for e in log if e["event"] == "prober.pod.invalid"]
        assert bad and {(e["pod_uid"], e["level"]) for e in bad} == {("broken", "error")}
        assert "not a validated pod wire form" in bad[0]["error"]
    finally:
        close(svc)


def test_replica_traffic_waits_briefly_after_a_drain_outcomes_do_not(bus: Bus) -> None:
    bus.pleg.set("_health", PlegHealth(ts=1.0))
    clock = FakeClock(100.0)  # the one clock of the service's graph (owner, replicas, loop)
    svc = ProberService(dataclasses.replace(bus.ctx, clock=clock), FakeRunner())
    try:
        run_until(bus, svc, lambda: svc.ready)
        replicas = {*svc.desired.sockets, *svc.pleg.sockets}

        def watched() -> set[object]:
            return {s for s, _ in svc.loop.poller.sockets}

        svc.loop.last_pump = clock.now  # just drained: the next poll holds replica traffic
        svc.loop.turn(svc.turn)  # at most HOLD of real time: the fake clock stands still
        assert svc.loop.holding and not watched() & replicas
        assert {svc.owner.socket, svc.wake.read_fd} <= watched()  # snapshots, probe outcomes
        svc.loop.last_pump = clock.now - HOLD  # the hold is over: every socket again
        svc.loop.turn(svc.turn)
        assert not svc.loop.holding and replicas <= watched()
    finally:
        close(svc)
