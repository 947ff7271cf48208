"""The pod workers' kubelet metrics (names, types, labels and buckets as the kubelet's
``pkg/kubelet/metrics``), observed by ``SyncLoop`` through two plain callables (``LoopDeps.
observe_work``, ``LoopDeps.restarted``) so the loop itself stays free of prometheus:

- ``kubelet_pod_worker_duration_seconds{operation_type}`` (histogram, the kubelet's default
  buckets): one observation per piece of work a pod worker finished, from when the loop handed
  it out to when its result was applied. ``operation_type``: ``create`` (the first sync of a
  worker), ``update`` (a sync a source's change asked for), ``sync`` (any other: periodic,
  PLEG event, probe verdict, error retry) and ``kill`` (a termination), as the kubelet's
  ``SyncPodType`` strings.
- ``kubelet_restarted_pods_total{static}``: pods a source wanted again, under the same UID,
  while they were being terminated (the kubelet's "deleted and recreated with the same UID
  while the kubelet was watching them"): their worker starts over with a ``create``.
  ``static="true"`` for pods of the file and http sources, ``static=""`` for the API server's,
  both series shown from the start (as the kubelet's).

In the agent the supervisor turns on prometheus-client's multiprocess mode, so the values land
in ``<rootDir>/run/metrics`` for the server's ``/metrics``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from podvisor.common.buckets import DEF_BUCKETS

__all__ = ["DEF_BUCKETS", "WorkerMetrics"]

OPERATIONS = ("create", "update", "sync", "kill")


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=False)
        self.duration = Histogram(
            "kubelet_pod_worker_duration_seconds", "Duration in seconds to sync a single pod. "
            "Broken down by operation type: create, update, or sync", ["operation_type"],
            buckets=DEF_BUCKETS, registry=self.registry)
        self.restarts = Counter(
            "kubelet_restarted_pods", "Number of pods that have been restarted because they "
            "were deleted and recreated with the same UID while the kubelet was watching them "
            "(common for static pods, extremely uncommon for API pods)", ["static"],
            registry=self.registry)
        for static in ("true", ""):
            self.restarts.labels(static)

    def observe_work(self, operation: str, seconds: float) -> None:
        self.duration.labels(operation).observe(max(0.0, seconds))

    def restarted(self, static: bool) -> None:
        self.restarts.labels("true" if static else "").inc()
