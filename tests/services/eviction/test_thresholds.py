"""Thresholds (pure, on the one FakeClock): hard thresholds met at once, soft ones after their
grace period, evictionMinimumReclaim keeping a met threshold met, the pressure condition held
for evictionPressureTransitionPeriod, the kubelet's messages' quantities."""

from __future__ import annotations

from podvisor.common import FakeClock
from podvisor.services.eviction import (
    EvictionManager,
    Observation,
    PodUsage,
    format_binary,
    parse_thresholds,
)

MI = 1 << 20
GI = 1 << 30
HARD = {"memory.available": "100Mi", "nodefs.available": "10%", "nodefs.inodesFree": "5%",
        "imagefs.available": "15%"}


def obs(mem_available: int = 2 * GI, fs_available: int = 50 * GI,
        inodes_free: int = 900) -> dict[str, Observation]:
    return {"memory.available": Observation(mem_available, 4 * GI),
            "nodefs.available": Observation(fs_available, 100 * GI),
            "nodefs.inodesFree": Observation(inodes_free, 1000),
            "imagefs.available": Observation(fs_available, 100 * GI)}


def pod(uid: str = "p1") -> PodUsage:
    return PodUsage(uid, f"default/{uid}", memory=50 * MI)


def test_the_hard_defaults_set_the_conditions_at_once_and_hold_them_for_the_transition_period(
) -> None:
    clock = FakeClock()
    thresholds, problems = parse_thresholds(HARD)
    assert problems == []
    m = EvictionManager(thresholds, transition=300.0)
    assert m.decide(clock.now, obs(), []).conditions == ()
    assert m.decide(clock.now, obs(mem_available=90 * MI), []).conditions == ("MemoryPressure",)
    clock.advance(10)
    # relieved: still MemoryPressure until 300 s after it was last met
    assert m.decide(clock.now, obs(), []).conditions == ("MemoryPressure",)
    clock.advance(289)
    assert m.decide(clock.now, obs(), []).conditions == ("MemoryPressure",)
    clock.advance(1)
    assert m.decide(clock.now, obs(), []).conditions == ()


def test_disk_and_inodes_make_disk_pressure() -> None:
    thresholds, _ = parse_thresholds(HARD)
    clock = FakeClock()
    m = EvictionManager(thresholds, transition=1.0)
    assert m.decide(clock.now, obs(fs_available=9 * GI), []).conditions == ("DiskPressure",)
    clock.advance(1)
    assert m.decide(clock.now, obs(inodes_free=49), []).conditions == ("DiskPressure",)
    clock.advance(1)
    assert m.decide(clock.now, obs(inodes_free=50), []).conditions == ()
    both = m.decide(clock.now, obs(mem_available=MI, fs_available=GI), [])
    assert both.conditions == ("MemoryPressure", "DiskPressure")


def test_a_soft_threshold_acts_only_after_its_grace_period() -> None:
    clock = FakeClock()
    thresholds, problems = parse_thresholds({}, {"memory.available": "1Gi"},
                                            {"memory.available": 60.0})
    assert problems == []
    m = EvictionManager(thresholds, transition=1.0, max_pod_grace=10)
    low = obs(mem_available=512 * MI)
    first = m.decide(clock.now, low, [pod()])
    assert first.conditions == ("MemoryPressure",) and first.evictions == ()
    clock.advance(59)
    assert m.decide(clock.now, low, [pod()]).evictions == ()
    clock.advance(1)
    [e] = m.decide(clock.now, low, [pod()]).evictions
    assert e.uid == "p1" and e.grace == 10  # min(evictionMaxPodGracePeriod, the pod's 30)


def test_a_soft_threshold_without_a_grace_period_is_refused() -> None:
    thresholds, problems = parse_thresholds({}, {"memory.available": "1Gi"})
    assert thresholds == [] and problems == [
        "evictionSoft.memory.available: no evictionSoftGracePeriod for it"]


def test_minimum_reclaim_keeps_a_met_threshold_met_until_threshold_plus_reclaim() -> None:
    clock = FakeClock()
    thresholds, _ = parse_thresholds({"memory.available": "100Mi"},
                                     reclaim={"memory.available": "200Mi"})
    m = EvictionManager(thresholds, transition=1.0)
    assert m.decide(clock.now, obs(mem_available=99 * MI), []).conditions == ("MemoryPressure",)
    clock.advance(1)
    # above the threshold, under threshold + reclaim: still met
    assert m.decide(clock.now, obs(mem_available=250 * MI), []).conditions == ("MemoryPressure",)
    clock.advance(1)
    assert m.decide(clock.now, obs(mem_available=300 * MI), []).conditions == ()
    clock.advance(1)
    # not met before: 250Mi is fine
    assert m.decide(clock.now, obs(mem_available=250 * MI), []).conditions == ()


def test_the_message_quantities_are_the_kubelets() -> None:
    assert format_binary(100 * MI) == "100Mi"
    assert format_binary(94371840) == "90Mi"
    assert format_binary(1536) == "1536"
    assert format_binary(0) == "0"
    thresholds, _ = parse_thresholds({"nodefs.available": "10%"})
    clock = FakeClock()
    m = EvictionManager(thresholds, transition=1.0)
    big = PodUsage("d", "default/d", storage=3 * GI)
    [e] = m.decide(clock.now, obs(fs_available=5 * GI), [big]).evictions
    assert e.message == ("The node was low on resource: ephemeral-storage. Threshold quantity: "
                         "10Gi, available: 5Gi. ")
