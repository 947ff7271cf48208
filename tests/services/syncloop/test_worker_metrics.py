"""The pod workers' and the status process's kubelet metrics: kubelet_pod_worker_duration_seconds
by operation_type, kubelet_restarted_pods_total{static}, kubelet_pod_start_duration_seconds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry

from podvisor.services.status.metrics import POD_START_BUCKETS, PodStartTimer
from podvisor.services.syncloop.metrics import DEF_BUCKETS, WorkerMetrics
from tests.services.status.test_status_process import Bus, entry, kill, record, run_until
from tests.services.status.test_status_process import bus as bus  # the fixture
from tests.services.syncloop.test_podworkers import Harness, manifest
from tests.support.mapvalues import status_value


def test_worker_durations_by_operation_and_a_restart_under_the_same_uid(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    seen: list[tuple[str, float]] = []
    restarts: list[bool] = []
    held: list[Callable[[], None]] = []
    h.loop.deps = replace(h.loop.deps, observe_work=lambda op, s: seen.append((op, s)),
                          restarted=restarts.append)
    h.set(manifest())
    assert seen[0] == ("create", 0.0) and set(h.running()) == {"a", "b"}
    h.set(manifest(containers=[{"name": "a", "image": "host", "command": ["sleep", "7"]}]))
    assert ("update", 0.0) in seen
    seen.clear()
    h.now += 200  # past the resync
    h.settle()
    assert [op for op, _ in seen] == ["sync"]
    # removed, then wanted again under the same UID while its termination is in flight
    h.loop.deps = replace(h.loop.deps, submit=held.append)
    seen.clear()
    h.loop.handle_pod_set("file", [], h.now)
    h.loop.step(h.now)
    assert len(held) == 1
    h.loop.handle_pod_set("file", [manifest()], h.now)
    h.now += 2.5
    held.pop()()
    h.loop.deps = replace(h.loop.deps, submit=lambda fn: fn())
    h.settle()
    assert seen[0] == ("kill", 2.5) and seen[1][0] == "create"  # the restarted pod starts over
    assert restarts == [True]  # a file source's pod: static
    assert set(h.running()) == {"a", "b"}
    assert any(e["event"] == "syncloop.pod.restarted" for e in h.log.events)


def test_a_removed_pod_is_no_restart(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    ops: list[str] = []
    restarts: list[bool] = []
    h.loop.deps = replace(h.loop.deps, observe_work=lambda op, s: ops.append(op),
                          restarted=restarts.append)
    h.set(manifest())
    h.set()
    assert ops == ["create", "kill"] and restarts == []
    h.set(manifest())  # long gone: a new worker, a create, no restart
    assert ops[-1] == "create" and restarts == []


def test_worker_metrics_are_the_kubelets() -> None:
    m = WorkerMetrics(CollectorRegistry(auto_describe=False))
    r = m.registry
    assert r.get_sample_value("kubelet_restarted_pods_total", {"static": "true"}) == 0
    assert r.get_sample_value("kubelet_restarted_pods_total", {"static": ""}) == 0
    m.observe_work("sync", 0.03)
    m.restarted(True)
    m.restarted(False)
    assert r.get_sample_value("kubelet_restarted_pods_total", {"static": "true"}) == 1
    assert r.get_sample_value("kubelet_restarted_pods_total", {"static": ""}) == 1
    labels = {"operation_type": "sync"}
    assert r.get_sample_value("kubelet_pod_worker_duration_seconds_count", labels) == 1
    assert r.get_sample_value("kubelet_pod_worker_duration_seconds_bucket",
                              {**labels, "le": "0.05"}) == 1
    assert r.get_sample_value("kubelet_pod_worker_duration_seconds_bucket",
                              {**labels, "le": "0.025"}) == 0
    assert DEF_BUCKETS == (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def test_pod_start_timer_observes_the_first_running_status_once() -> None:
    t = PodStartTimer(CollectorRegistry(auto_describe=False))
    t.seen("u1", 10.0)
    t.seen("u2", 10.0)
    t.seen("u3", 10.0)
    t.computed({"u1": status_value({"phase": "Pending"}),
                "u2": status_value({"phase": "Failed"})}, [], 11.0)
    t.computed({"u1": status_value({"phase": "Running"})}, [], 13.5)
    t.computed({"u1": status_value({"phase": "Running"})}, [], 20.0)  # already timed
    t.gone("u3")
    r = t.registry
    assert r.get_sample_value("kubelet_pod_start_duration_seconds_count") == 1
    assert r.get_sample_value("kubelet_pod_start_duration_seconds_sum") == 3.5
    assert r.get_sample_value("kubelet_pod_start_duration_seconds_bucket", {"le": "4.0"}) == 1
    assert r.get_sample_value("kubelet_pod_start_duration_seconds_bucket", {"le": "3.0"}) == 0
    assert t.waiting == 0 and POD_START_BUCKETS[0] == 0.5 and POD_START_BUCKETS[-1] == 3600


def test_status_process_times_a_pod_from_first_seen_to_running(bus: Bus) -> None:
    svc = bus.service()
    bus.desired.set("u1", entry("u1"))
    bus.relist(u1=record("c1", running=False))
    run_until(bus, svc, lambda: svc.owner.get("u1"))
    assert svc.pod_start.waiting == 1
    bus.clock.now += 4.0
    bus.relist(u1=record("c1", running=True))
    run_until(bus, svc, lambda: (v := svc.owner.get("u1")) is not None
              and v.status.phase == "Running")
    r = svc.pod_start.registry
    assert r.get_sample_value("kubelet_pod_start_duration_seconds_count") == 1
    took = r.get_sample_value("kubelet_pod_start_duration_seconds_sum")
    assert took is not None and 4.0 < took < 5.0  # plus the turns' COALESCE steps
    kill(svc)


def test_kubelet_histograms_bucket_as_the_kubelet() -> None:
    """PLEG's relist histograms use Go's DefBuckets, runtime operations the kubelet's
    ExponentialBuckets(.005, 2.5, 14): the same `le` bounds a kubelet dashboard expects."""
    from prometheus_client.metrics import MetricWrapperBase

    from podvisor.common.buckets import exponential_buckets
    from podvisor.services.cri.instrumented import _Metrics
    from podvisor.services.pleg.service import RelistMetrics

    def bounds(metric: MetricWrapperBase) -> list[float]:
        return [float(s.labels["le"]) for family in metric.collect() for s in family.samples
                if s.name.endswith("_bucket")]

    relist = RelistMetrics()
    relist.duration.observe(0.01)
    relist.interval.observe(1.0)
    assert bounds(relist.duration) == bounds(relist.interval) == [*DEF_BUCKETS, float("inf")]
    ops = _Metrics(CollectorRegistry(auto_describe=False))
    ops.latency.labels("list_containers").observe(0.01)
    assert bounds(ops.latency) == [*exponential_buckets(0.005, 2.5, 14), float("inf")]
    assert exponential_buckets(0.005, 2.5, 14)[:3] == (0.005, 0.0125, 0.03125)
