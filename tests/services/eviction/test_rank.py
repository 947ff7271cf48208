"""Ranking as the kubelet's (pure, on the one FakeClock): usage over requests first, then lower
priority, then most usage above requests; BestEffort before Burstable before Guaranteed in
practice; critical pods never; one pod per pass and none while the last one is not down;
local storage limits evict at once with the kubelet's messages."""

from __future__ import annotations

from podvisor.common import FakeClock
from podvisor.services.eviction import (
    ContainerUsage,
    EvictionManager,
    Observation,
    PodUsage,
    parse_thresholds,
    rank,
)

MI = 1 << 20
GI = 1 << 30


def usage(uid: str, memory: int, request: int = 0, priority: int = 0, qos: str = "BestEffort",
          critical: bool = False) -> PodUsage:
    return PodUsage(uid, f"default/{uid}", priority=priority, qos=qos, critical=critical,
                    memory=memory, containers=(ContainerUsage("c", request, memory),))


def test_memory_rank_exceeding_requests_then_priority_then_usage_above_requests() -> None:
    besteffort = usage("be", 10 * MI)
    burstable_over = usage("bu", 300 * MI, request=100 * MI, qos="Burstable")
    burstable_under = usage("bu2", 50 * MI, request=100 * MI, qos="Burstable")
    guaranteed = usage("gu", 400 * MI, request=400 * MI, qos="Guaranteed")
    important = usage("hi", 900 * MI, priority=1000)
    critical = usage("crit", 2 * GI, critical=True)
    order = [p.uid for p in rank("memory", [guaranteed, burstable_under, important, critical,
                                            besteffort, burstable_over])]
    # over requests: bu (200Mi above), be (10Mi above) at priority 0, then hi (priority 1000);
    # then those within requests by usage above requests: gu (0) before bu2 (-50Mi)
    assert order == ["bu", "be", "hi", "gu", "bu2"]


def test_pid_rank_by_priority_then_processes() -> None:
    a = PodUsage("a", "default/a", priority=10, pids=500)
    b = PodUsage("b", "default/b", priority=0, pids=5)
    c = PodUsage("c", "default/c", priority=0, pids=50)
    assert [p.uid for p in rank("pids", [a, b, c])] == ["c", "b", "a"]


def test_one_pod_per_pass_with_the_kubelets_message_and_none_until_it_is_down() -> None:
    clock = FakeClock()
    thresholds, _ = parse_thresholds({"memory.available": "100Mi"})
    m = EvictionManager(thresholds, transition=1.0)
    low = {"memory.available": Observation(90 * MI, 4 * GI)}
    pods = [usage("gu", 200 * MI, request=200 * MI, qos="Guaranteed"), usage("be", 150 * MI)]
    [e] = m.decide(clock.now, low, pods).evictions
    assert e.uid == "be" and e.grace == 1
    assert e.message == (
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 90Mi. "
        "Container c was using 150Mi, request is 0, has larger consumption of memory. ")
    clock.advance(10)
    assert m.decide(clock.now, low, pods).evictions == ()  # waiting for "be" to be down
    m.done("be")
    clock.advance(10)
    [e] = m.decide(clock.now, low, pods[:1]).evictions
    assert e.uid == "gu"
    clock.advance(30)  # the kubelet waits at most 30 s for the cleanup
    [e] = m.decide(clock.now, low, pods[:1]).evictions
    assert e.uid == "gu"


def test_critical_pods_are_never_evicted() -> None:
    clock = FakeClock()
    thresholds, _ = parse_thresholds({"memory.available": "100Mi"})
    m = EvictionManager(thresholds, transition=1.0)
    low = {"memory.available": Observation(MI, 4 * GI)}
    d = m.decide(clock.now, low, [usage("static", GI, critical=True)])
    assert d.conditions == ("MemoryPressure",) and d.evictions == ()


def test_local_storage_limits_evict_at_once() -> None:
    clock = FakeClock()
    m = EvictionManager([], transition=1.0)
    empty_dir = PodUsage("v", "default/v", storage=20 * MI,
                         volumes=(("scratch", 20 * MI, 10 * MI),),
                         containers=(ContainerUsage("c"),))
    pod_limit = PodUsage("p", "default/p", storage=30 * MI,
                         containers=(ContainerUsage("a", storage=5 * MI, storage_limit=10 * MI),
                                     ContainerUsage("b", storage=1 * MI, storage_limit=10 * MI)))
    container = PodUsage("c", "default/c", storage=12 * MI,
                         containers=(ContainerUsage("a", storage=12 * MI, storage_limit=10 * MI),
                                     ContainerUsage("b")))
    fine = PodUsage("f", "default/f", storage=MI,
                    containers=(ContainerUsage("a", storage=MI, storage_limit=10 * MI),))
    d = m.decide(clock.now, {}, [empty_dir, pod_limit, container, fine])
    assert {e.uid: e.message for e in d.evictions} == {
        "v": 'Usage of EmptyDir volume "scratch" exceeds the limit "10Mi". ',
        "p": "Pod ephemeral local storage usage exceeds the total limit of containers 20Mi. ",
        "c": "Pod ephemeral local storage usage exceeds the total limit of containers 10Mi. ",
    }
    assert d.conditions == ()
