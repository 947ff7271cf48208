"""Reading the ``probes`` map (for its consumers: status, syncloop). Pure, no imports of the
prober's machinery.

A ``probes`` item speaks about one container ID only: a verdict whose ``container_id`` is not the
container's current one (the prober has not seen the new container yet) is ignored, so the
consumer falls back to its default (not ready / not started while a probe is declared).
"""

from __future__ import annotations

from collections.abc import Iterable

from podvisor.ipc.maps import PlegContainer, PlegPod, PodProbes


def _current_ids(containers: Iterable[PlegContainer]) -> dict[str, str]:
    """Container name -> ID of its newest runtime container."""
    best: dict[str, tuple[int, str]] = {}
    for c in containers:
        if not c.id:
            continue
        key = (c.created_at, c.id)
        name = c.name
        if name not in best or key > best[name]:
            best[name] = key
    return {name: key[1] for name, key in best.items()}


def probe_verdicts(entry: PodProbes | None, pleg_record: PlegPod | None
                   ) -> tuple[dict[str, bool], dict[str, bool]]:
    """(readiness, started) by container name, from a pod's ``probes`` value and ``pleg``
    record; only verdicts about each container's current ID, only where a probe gave one."""
    if entry is None or pleg_record is None:
        return {}, {}
    current = _current_ids(pleg_record.containers)
    ready: dict[str, bool] = {}
    started: dict[str, bool] = {}
    for name, item in entry.containers.items():
        if current.get(name) != item.container_id:
            continue
        if item.ready is not None:
            ready[name] = item.ready
        if item.started is not None:
            started[name] = item.started
    return ready, started


def failed_probes(entry: PodProbes | None) -> dict[str, str]:
    """Container ID -> the probe whose failure kills it ("liveness" or "startup"), for the
    containers whose liveness or startup probe failed past its threshold."""
    if entry is None:
        return {}
    return {item.container_id: "startup" if item.failed_probe == "startup" else "liveness"
            for item in entry.containers.values()
            if item.liveness == "failure" and item.container_id}


def liveness_failed(entry: PodProbes | None) -> frozenset[str]:
    """IDs of containers whose liveness (or startup) probe failed past its threshold."""
    if entry is None:
        return frozenset()
    return frozenset(item.container_id for item in entry.containers.values()
                     if item.liveness == "failure" and item.container_id)
