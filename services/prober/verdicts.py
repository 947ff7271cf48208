"""Reading the ``probes`` map (for its consumers: status, syncloop). Pure, no imports of the
prober's machinery.

A ``probes`` item speaks about one container ID only: a verdict whose ``container_id`` is not the
container's current one (the prober has not seen the new container yet) is ignored, so the
consumer falls back to its default (not ready / not started while a probe is declared).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def _current_ids(containers: Iterable[Any]) -> dict[str, str]:
    """Container name -> ID of its newest runtime container."""
    best: dict[str, tuple[int, str]] = {}
    for c in containers:
        if not isinstance(c, Mapping) or not c.get("id"):
            continue
        key = (int(c.get("created_at", 0) or 0), str(c["id"]))
        name = str(c.get("name", ""))
        if name not in best or key > best[name]:
            best[name] = key
    return {name: key[1] for name, key in best.items()}


def probe_verdicts(entry: Any, pleg_record: Any) -> tuple[dict[str, bool], dict[str, bool]]:
    """(readiness, started) by container name, from a pod's ``probes`` item and ``pleg`` record;
    only verdicts about each container's current ID, only where a probe gave one."""
    if not isinstance(entry, Mapping) or not isinstance(pleg_record, Mapping):
        return {}, {}
    current = _current_ids(pleg_record.get("containers") or [])
    ready: dict[str, bool] = {}
    started: dict[str, bool] = {}
    for name, item in entry.items():
        if not isinstance(item, Mapping) or current.get(str(name)) != item.get("container_id"):
            continue
        if isinstance(item.get("ready"), bool):
            ready[str(name)] = item["ready"]
        if isinstance(item.get("started"), bool):
            started[str(name)] = item["started"]
    return ready, started


def failed_probes(entry: Any) -> dict[str, str]:
    """Container ID -> the probe whose failure kills it ("liveness" or "startup"), for the
    containers whose liveness or startup probe failed past its threshold."""
    if not isinstance(entry, Mapping):
        return {}
    return {str(item["container_id"]): ("startup" if item.get("failed_probe") == "startup"
                                        else "liveness")
            for item in entry.values()
            if isinstance(item, Mapping) and item.get("liveness") == "failure"
            and item.get("container_id")}


def liveness_failed(entry: Any) -> frozenset[str]:
    """IDs of containers whose liveness (or startup) probe failed past its threshold."""
    if not isinstance(entry, Mapping):
        return frozenset()
    return frozenset(str(item.get("container_id")) for item in entry.values()
                     if isinstance(item, Mapping) and item.get("liveness") == "failure"
                     and item.get("container_id"))
