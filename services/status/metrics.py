"""``kubelet_pod_start_duration_seconds`` (histogram, the kubelet's buckets): from the moment
the status process first sees a pod (its ``desired`` entry: the sync loop publishes it the
moment a source hands the pod in) to the first status it computes with phase ``Running`` (every
container created, at least one running: the kubelet observes the same transition, from its
"first seen" annotation). One observation per pod; a pod that ends (Succeeded, Failed) or
leaves ``desired`` before running is forgotten. A pod the process already had a status for
when it started (persisted statuses) is not timed: its first sighting is unknown.

In the agent the supervisor turns on prometheus-client's multiprocess mode, so the values land
in ``<rootDir>/run/metrics`` for the server's ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Histogram

from podvisor.ipc.maps import PodStatusValue

__all__ = ["POD_START_BUCKETS", "PodStartTimer"]

# the kubelet's podStartupDurationBuckets
POD_START_BUCKETS = (0.5, 1, 2, 3, 4, 5, 6, 8, 10, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480,
                     600, 900, 1200, 1800, 2700, 3600)
_ENDED = ("Succeeded", "Failed")


class PodStartTimer:
    """Not thread-safe (the status loop's thread)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=False)
        self.histogram = Histogram(
            "kubelet_pod_start_duration_seconds", "Duration in seconds from kubelet seeing a "
            "pod for the first time to the pod starting to run", buckets=POD_START_BUCKETS,
            registry=self.registry)
        self._seen: dict[str, float] = {}  # pod UID -> first seen (monotonic)

    def seen(self, uid: str, mono: float) -> None:
        """A pod this process had no status for appeared in ``desired``."""
        self._seen.setdefault(uid, mono)

    def gone(self, uid: str) -> None:
        """The pod left ``desired``."""
        self._seen.pop(uid, None)

    def computed(self, statuses: Mapping[str, PodStatusValue], deleted: list[str],
                 mono: float) -> None:
        """New statuses (pod UID -> status) and retired pods, computed at ``mono``."""
        for uid, status in statuses.items():
            first = self._seen.get(uid)
            if first is None:
                continue
            phase = status.status.phase
            if phase == "Running":
                self.histogram.observe(max(0.0, mono - first))
                del self._seen[uid]
            elif phase in _ENDED:
                del self._seen[uid]
        for uid in deleted:
            self._seen.pop(uid, None)

    @property
    def waiting(self) -> int:
        """Pods seen and not running yet."""
        return len(self._seen)
