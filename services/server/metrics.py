"""``/metrics`` of the main port: what the server's replicas know, in Prometheus text format.

Rendered per scrape by a prometheus-client custom collector over the current ``View`` (no
metric objects are kept, so nothing goes stale): from the ``pleg`` map,
``kubelet_running_pods`` (pods with a ready sandbox), ``kubelet_running_containers
{container_state}`` (``created``, ``running``, ``exited``, ``unknown``) and
``kubelet_pleg_last_seen_seconds`` (wall time of PLEG's last good relist); PLEG's own counters
from its ``_health`` entry as ``podvisor_pleg_relists_total`` and
``podvisor_pleg_relist_errors_total`` (they restart from 0 when PLEG restarts: a counter reset,
which ``rate()`` handles).

The supervised processes, from the supervisor's ``status`` rows (``ports.py``):
``podvisor_process_restarts_total{process}`` (the supervisor's restart count: monotonic while
the agent runs, a reset when the agent restarts), ``podvisor_process_state{process,state}`` (1
for the current state, 0 for the others) and ``podvisor_heartbeat_age_seconds{process}`` (RUNNING
processes only).

Metrics made inside other processes come through prometheus-client's multiprocess mode (the
supervisor sets ``PROMETHEUS_MULTIPROC_DIR`` to ``<rootDir>/run/metrics`` before any child
starts): PLEG's ``kubelet_pleg_relist_duration_seconds`` and
``kubelet_pleg_relist_interval_seconds`` histograms; the sync loop's CRI call counters and
latency (``kubelet_runtime_operations_*``), ``kubelet_started_containers_total``,
``kubelet_pod_worker_duration_seconds{operation_type}`` and
``kubelet_restarted_pods_total{static}`` (services/syncloop/metrics.py); the status process's
``kubelet_pod_start_duration_seconds`` (services/status/metrics.py); imagegc's; and every
service-loop process's ``podvisor_bus_messages_total`` / ``podvisor_bus_dropped_total{reason}``
(common/busmetrics.py). The prober's ``prober_probe_total`` goes to ``/metrics/probes`` only.

``/metrics/resource`` renders the same figures as ``/stats/summary`` under the kubelet's
resource metric names.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from podvisor.ipc.control import ProcessRow, ProcessState
from podvisor.ipc.maps import PlegHealth, PlegPod
from podvisor.services.server.replicas import View

__all__ = ["CONTENT_TYPE", "render_metrics", "render_probe_metrics", "render_resource_metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_STATES = {"CONTAINER_CREATED": "created", "CONTAINER_RUNNING": "running",
           "CONTAINER_EXITED": "exited"}


STATES = tuple(s.name for s in ProcessState)


class _ViewCollector(Collector):
    def __init__(self, view: View, processes: list[ProcessRow] | None) -> None:
        self._view = view
        self._processes = processes

    def collect(self) -> Iterator[Metric]:
        yield from self._pleg()
        if self._processes is not None:
            yield from self._process_metrics(self._processes)

    def _process_metrics(self, rows: list[ProcessRow]) -> Iterator[Metric]:
        restarts = CounterMetricFamily("podvisor_process_restarts",
                                       "Restarts of each supervised process", labels=["process"])
        state = GaugeMetricFamily("podvisor_process_state",
                                  "1 for the supervised process's current state",
                                  labels=["process", "state"])
        age = GaugeMetricFamily("podvisor_heartbeat_age_seconds",
                                "Seconds since the running process's last heartbeat",
                                labels=["process"])
        for row in sorted(rows, key=lambda r: r.name):
            restarts.add_metric([row.name], row.restarts)
            for s in STATES:
                state.add_metric([row.name, s], 1.0 if row.state.name == s else 0.0)
            if row.heartbeat_age is not None:
                age.add_metric([row.name], row.heartbeat_age)
        yield restarts
        yield state
        yield age

    def _pleg(self) -> Iterator[Metric]:
        pods = 0
        states = dict.fromkeys(("created", "running", "exited", "unknown"), 0)
        health: PlegHealth | None = None
        for record in self._view.pleg.values():
            if isinstance(record, PlegHealth):
                health = record
            if not isinstance(record, PlegPod):
                continue
            if any(s.state == "SANDBOX_READY" for s in record.sandboxes):
                pods += 1
            for c in record.containers:
                states[_STATES.get(c.state, "unknown")] += 1
        yield GaugeMetricFamily("kubelet_running_pods",
                                "Number of pods that have a running pod sandbox", value=pods)
        running = GaugeMetricFamily("kubelet_running_containers",
                                    "Number of containers currently running",
                                    labels=["container_state"])
        for state, count in states.items():
            running.add_metric([state], count)
        yield running
        if health is not None:
            yield GaugeMetricFamily(
                "kubelet_pleg_last_seen_seconds",
                "Timestamp in seconds when PLEG was last seen active",
                value=health.last_relist_ok)
            yield CounterMetricFamily("podvisor_pleg_relists", "PLEG relists since it started",
                                      value=health.relists)
            yield CounterMetricFamily("podvisor_pleg_relist_errors",
                                      "PLEG relists that failed since it started",
                                      value=health.relist_errors)


def render_metrics(view: View, processes: list[ProcessRow] | None = None,
                   multiprocess_dir: str = "") -> bytes:
    """``multiprocess_dir``: prometheus-client's multiprocess directory (the agent's
    ``run/metrics``), whose files every child writes; summed in (dead processes' counters and
    histograms included, so they never go back when a process restarts)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ViewCollector(view, processes))
    if multiprocess_dir and os.path.isdir(multiprocess_dir):
        registry.register(_Filtered(multiprocess_dir, lambda name: not name.startswith("prober_")))
    return generate_latest(registry)


class _Filtered(Collector):
    """The multiprocess directory's families whose name ``keep`` accepts."""

    def __init__(self, directory: str, keep: Callable[[str], bool]) -> None:
        self._inner = MultiProcessCollector(None, path=directory)  # type: ignore[no-untyped-call]
        self._keep = keep

    def collect(self) -> Iterator[Metric]:
        found = self._inner.collect()  # type: ignore[no-untyped-call]
        return (m for m in found if self._keep(m.name))


def render_probe_metrics(multiprocess_dir: str) -> bytes:
    """``/metrics/probes``: the prober's ``prober_probe_total{probe_type,result,container,pod,
    namespace}`` (made in the prober process, read from the multiprocess directory)."""
    registry = CollectorRegistry(auto_describe=False)
    if multiprocess_dir and os.path.isdir(multiprocess_dir):
        registry.register(_Filtered(multiprocess_dir, lambda name: name.startswith("prober_")))
    return generate_latest(registry)


def _usage(part: Any) -> tuple[float, float]:
    """(CPU core-seconds, working set bytes) of a ``/stats/summary`` node, pod or container
    (``cpu.usageCoreNanoSeconds``, ``memory.workingSetBytes``; 0 when not reported)."""
    cpu = part.get("cpu") if isinstance(part, Mapping) else None
    memory = part.get("memory") if isinstance(part, Mapping) else None
    nanos = cpu.get("usageCoreNanoSeconds", 0) if isinstance(cpu, Mapping) else 0
    working = memory.get("workingSetBytes", 0) if isinstance(memory, Mapping) else 0
    return nanos / 1e9, working


class _ResourceCollector(Collector):
    """``/metrics/resource`` from a ``/stats/summary`` body (the kubelet's names)."""

    def __init__(self, summary: Mapping[str, Any] | None) -> None:
        self._summary = summary

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("scrape_error",
                                "1 if there was an error while getting container metrics, "
                                "0 otherwise", value=0 if self._summary is not None else 1)
        if self._summary is None:
            return
        node_cpu, node_memory = _usage(self._summary.get("node", {}))
        yield CounterMetricFamily("node_cpu_usage_seconds",
                                  "Cumulative cpu time consumed by the node in core-seconds",
                                  value=node_cpu)
        yield GaugeMetricFamily("node_memory_working_set_bytes",
                                "Current working set of the node in bytes", value=node_memory)
        labels = ["container", "pod", "namespace"]
        c_cpu = CounterMetricFamily("container_cpu_usage_seconds",
                                    "Cumulative cpu time consumed by the container in "
                                    "core-seconds", labels=labels)
        c_mem = GaugeMetricFamily("container_memory_working_set_bytes",
                                  "Current working set of the container in bytes", labels=labels)
        p_cpu = CounterMetricFamily("pod_cpu_usage_seconds",
                                    "Cumulative cpu time consumed by the pod in core-seconds",
                                    labels=["pod", "namespace"])
        p_mem = GaugeMetricFamily("pod_memory_working_set_bytes",
                                  "Current working set of the pod in bytes",
                                  labels=["pod", "namespace"])
        for pod in self._summary.get("pods", []):
            ref = pod.get("podRef", {})
            name, ns = str(ref.get("name", "")), str(ref.get("namespace", ""))
            for c in pod.get("containers", []):
                values = [str(c.get("name", "")), name, ns]
                cpu, memory = _usage(c)
                c_cpu.add_metric(values, cpu)
                c_mem.add_metric(values, memory)
            cpu, memory = _usage(pod)
            p_cpu.add_metric([name, ns], cpu)
            p_mem.add_metric([name, ns], memory)
        yield from (c_cpu, c_mem, p_cpu, p_mem)


def render_resource_metrics(summary: Mapping[str, Any] | None) -> bytes:
    """``/metrics/resource``: node, pod and container CPU and memory (the kubelet's names);
    ``summary`` None when the runtime did not answer (``scrape_error 1``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ResourceCollector(summary))
    return generate_latest(registry)
