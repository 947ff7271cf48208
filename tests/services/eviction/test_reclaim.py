"""Node-level reclaim before an eviction (pure, on the one FakeClock): the kubelet's
``buildSignalToNodeReclaimFuncs`` (disk signals: dead containers then unused images; nodefs
none with a dedicated imagefs; memory and PIDs none), ``reclaimNodeLevelResources`` (no pod
evicted when, read again, no threshold is met with its minimum reclaim; else the ranked pod,
with the message of the pass), and the service's exchange with imagegc over the bus messages
(the request republished until answered, the events)."""

from __future__ import annotations

from typing import Any

from podvisor.common import FakeClock
from podvisor.common.logs import MemoryLogger
from podvisor.ipc.maps import NodePressure
from podvisor.ipc.messages import FailPod, NodeResourcesReclaimed, ReclaimNodeResources
from podvisor.services.eviction import (
    ContainerUsage,
    EvictionManager,
    Observation,
    PodUsage,
    parse_thresholds,
)
from podvisor.services.eviction.reclaim import node_reclaim_funcs
from podvisor.services.eviction.service import EventSink, EvictionService, Inputs

MI = 1 << 20
GI = 1 << 30
BOTH = ("containers", "images")


def test_disk_signals_reclaim_containers_then_images_memory_and_pids_none() -> None:
    shared = node_reclaim_funcs(dedicated_imagefs=False)
    for signal in ("nodefs.available", "nodefs.inodesFree", "imagefs.available",
                   "imagefs.inodesFree"):
        assert shared[signal] == BOTH
    for signal in ("memory.available", "allocatableMemory.available", "pid.available"):
        assert signal not in shared
    dedicated = node_reclaim_funcs(dedicated_imagefs=True)
    assert "nodefs.available" not in dedicated and "nodefs.inodesFree" not in dedicated
    assert dedicated["imagefs.available"] == BOTH


def disk(available: int) -> dict[str, Observation]:
    return {"nodefs.available": Observation(available, 100 * MI),
            "memory.available": Observation(2 * GI, 4 * GI)}


def filler(uid: str = "be", used: int = 30 * MI) -> PodUsage:
    return PodUsage(uid, f"default/{uid}", storage=used,
                    containers=(ContainerUsage("c", storage=used),))


def manager(reclaim: str = "0") -> EvictionManager:
    thresholds, _ = parse_thresholds({"nodefs.available": "40Mi", "memory.available": "100Mi"},
                                     reclaim={"nodefs.available": reclaim})
    return EvictionManager(thresholds, transition=1.0,
                           reclaim_funcs=node_reclaim_funcs(False))


def test_a_disk_threshold_asks_for_reclaim_first_and_evicts_nothing_when_it_sufficed() -> None:
    clock = FakeClock()
    m = manager()
    d = m.decide(clock.now, disk(30 * MI), [filler()])
    assert (d.reclaim, d.evictions, d.starved, d.signal) == (
        BOTH, (), "ephemeral-storage", "nodefs.available")
    assert d.conditions == ("DiskPressure",)
    after = m.after_reclaim(disk(60 * MI), clock.now)
    assert after.reclaimed and after.evictions == ()
    assert after.conditions == ("DiskPressure",)  # held for the transition period anyway


def test_a_reclaim_short_of_the_threshold_evicts_the_ranked_pod_with_the_passs_message() -> None:
    clock = FakeClock()
    m = manager()
    m.decide(clock.now, disk(30 * MI), [filler("small", 1 * MI), filler("big", 30 * MI)])
    after = m.after_reclaim(disk(35 * MI), clock.now)
    assert not after.reclaimed
    [e] = after.evictions
    assert e.uid == "big"
    assert e.message.startswith("The node was low on resource: ephemeral-storage. Threshold "
                                "quantity: 40Mi, available: 30Mi. ")  # as the pass read it
    assert m.waiting == {"big": clock.now}


def test_after_reclaim_the_minimum_reclaim_must_be_met_too() -> None:
    """``thresholdsMet(..., enforceMinReclaim=true)``: above the threshold but not above
    threshold + minimum reclaim still evicts."""
    clock = FakeClock()
    m = manager(reclaim="20Mi")
    m.decide(clock.now, disk(30 * MI), [filler()])
    assert m.after_reclaim(disk(50 * MI), clock.now).evictions != ()
    m.done("be")
    clock.advance(10)
    m.decide(clock.now, disk(30 * MI), [filler()])
    assert m.after_reclaim(disk(61 * MI), clock.now).reclaimed


def test_memory_pressure_evicts_at_once_without_reclaim() -> None:
    clock = FakeClock()
    m = manager()
    low = {"memory.available": Observation(50 * MI, 4 * GI),
           "nodefs.available": Observation(90 * MI, 100 * MI)}
    hog = PodUsage("hog", "default/hog", memory=300 * MI,
                   containers=(ContainerUsage("c", 0, 300 * MI),))
    d = m.decide(clock.now, low, [hog])
    assert d.reclaim == () and [e.uid for e in d.evictions] == ["hog"]
    assert d.starved == "memory"


class Bus:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def publish(self, message: Any) -> None:
        self.sent.append(message)


class Pressure:
    def __init__(self) -> None:
        self.value: NodePressure | None = None

    def set(self, key: str, value: NodePressure) -> None:
        self.value = value


def service(clock: FakeClock, available: list[int], pods: list[PodUsage]
            ) -> tuple[EvictionService, Bus, list[tuple[str, str, str]]]:
    bus, events = Bus(), []
    readings = iter(available)
    svc = EvictionService(
        manager(), Inputs(lambda: disk(next(readings)), lambda: {}, lambda: {},
                          lambda desired, pleg: pods, clock.wall),
        Pressure(), bus, MemoryLogger(), 1.0,  # type: ignore[arg-type]
        EventSink(lambda t, r, m, o: events.append((t, r, m)), lambda: None), "node-a")
    return svc, bus, events


def test_the_service_asks_imagegc_republishes_until_answered_then_reads_again() -> None:
    clock = FakeClock()
    svc, bus, events = service(clock, [30 * MI, 60 * MI], [filler()])
    svc.step(clock.monotonic())
    [ask] = bus.sent
    assert isinstance(ask, ReclaimNodeResources)
    assert (ask.signal, ask.containers, ask.images) == ("nodefs.available", True, True)
    assert events == [("Warning", "EvictionThresholdMet",
                       "Attempting to reclaim ephemeral-storage")]
    clock.advance(5.0)  # past the monitoring period: no new pass while the reclaim runs
    svc.step(clock.monotonic())  # (a pass would read the signals: the readings run out)
    assert bus.sent == [ask, ask]  # the bus may drop it: asked again, same id
    svc.answered(NodeResourcesReclaimed(id="another", containers=9))  # not this request's
    svc.answered(NodeResourcesReclaimed(id=ask.id, containers=2, images=1, image_bytes=5))
    svc.step(clock.monotonic())
    assert not any(isinstance(m, FailPod) for m in bus.sent)
    assert events[-1] == ("Normal", "NodeResourcesReclaimed",
                          "Deleted 2 unused containers and 1 unused images (5 bytes) to "
                          "reclaim ephemeral-storage: able to reduce resource pressure "
                          "without evicting pods.")
    assert svc.reclaiming is None


def test_an_unanswered_reclaim_goes_on_to_the_eviction_after_its_wait() -> None:
    clock = FakeClock()
    svc, bus, events = service(clock, [30 * MI, 30 * MI], [filler()])
    svc.step(clock.monotonic())
    while svc.reclaiming is not None:
        clock.advance(0.5)
        svc.step(clock.monotonic())
    fails = [m for m in bus.sent if isinstance(m, FailPod)]
    assert fails and fails[0].uid == "be" and fails[0].reason == "Evicted"
    assert events[-1][2].endswith(": imagegc did not answer; must evict pod(s) to reclaim "
                                  "ephemeral-storage.")
