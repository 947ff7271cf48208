"""Every replicated map, declared once: its name and the type of its values.

A map's values cross the bus (``clone.<map>.update`` and snapshots) in their wire form; a typed
value is a versioned frozen dataclass with ``to_wire()`` and ``from_wire()``. ``MapOwner`` takes
the type's ``to_wire`` as ``encode``, ``MapReplica`` its ``from_wire`` as ``decode``: a value
of an unknown version (or a malformed one) is dropped by the replica and counted in
``MapReplica.value_drops`` by reason, like a message the codec rejects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["DESIRED", "PLEG", "POD_SET_KEY", "PROBES", "STATUSES", "ContainerVerdict",
           "MapValueError", "PodProbes", "PodSetValue", "pods_map"]

DESIRED = "desired"  # pod UID -> the pod, its worker state, waiting reasons (owner: syncloop)
PLEG = "pleg"  # pod UID -> sandboxes and containers; "_health" (owner: pleg)
PROBES = "probes"  # pod UID -> probe verdicts per container (owner: prober)
STATUSES = "statuses"  # pod UID -> PodStatus (owner: status)
POD_SET_KEY = "set"  # the one key of a pods-<source> map


def pods_map(source: str) -> str:
    """The map of one source's pod set: ``pods-file``, ``pods-http`` (owner: that source)."""
    return f"pods-{source}"


class MapValueError(ValueError):
    """A map value that is not a declared type's wire form; ``reason`` as the codec's:
    ``version`` (unknown version) or ``fields`` (malformed)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class PodSetValue:
    """The FULL set of pods one source wants, set on every change and every relist (the sources
    are stateless: a restarted source just sets it again).

    ``source``: "file" | "http". ``pods``: ``Pod.to_dict()`` of each valid, defaulted pod, in
    file-name order (rebuild with ``podvisor.services.pod.pod_from_dict``). ``errors``: one
    ``{"file" or "url": where, "field": path, "reason": text}`` per rejected input. ``ts``:
    the monotonic time the set was read."""

    VERSION: ClassVar[int] = 1
    source: str
    pods: list[dict[str, Any]]
    errors: list[dict[str, Any]]
    ts: float = 0.0

    def __eq__(self, other: object) -> bool:  # a re-read with nothing new is no change
        return (isinstance(other, PodSetValue) and self.source == other.source
                and self.pods == other.pods and self.errors == other.errors)

    def __hash__(self) -> int:
        return hash(self.source)

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.VERSION, "source": self.source, "pods": self.pods,
                "errors": self.errors, "ts": self.ts}

    @classmethod
    def from_wire(cls, raw: Any) -> PodSetValue:
        if not isinstance(raw, dict):
            raise MapValueError("fields", "pod set: not a map")
        if raw.get("v") != cls.VERSION:
            raise MapValueError("version", f"pod set v{raw.get('v')!r}")
        source, pods, errors, ts = (raw.get(k) for k in ("source", "pods", "errors", "ts"))
        if (not isinstance(source, str) or not isinstance(pods, list)
                or not all(isinstance(p, dict) for p in pods) or not isinstance(errors, list)
                or isinstance(ts, bool) or not isinstance(ts, int | float)):
            raise MapValueError("fields", "pod set: wrong field types")
        return cls(source, pods, errors, float(ts))


_OPT_BOOL = (bool, type(None))
_OPT_STR = (str, type(None))


@dataclass(frozen=True)
class ContainerVerdict:
    """What the prober says about one container (by its current runtime ID): ``ready`` and
    ``started`` (None: no such probe), ``liveness`` ("success" | "failure" | None),
    ``failed_probe`` ("startup" | "liveness" | None), ``ts``: since when (monotonic)."""

    container_id: str
    ready: bool | None = None
    started: bool | None = None
    liveness: str | None = None
    failed_probe: str | None = None
    ts: float = 0.0

    def to_wire(self) -> dict[str, Any]:
        return {"container_id": self.container_id, "ready": self.ready,
                "started": self.started, "liveness": self.liveness,
                "failed_probe": self.failed_probe, "ts": self.ts}

    @classmethod
    def from_wire(cls, raw: Any) -> ContainerVerdict:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("container_id"), str):
            raise MapValueError("fields", "probe verdict: no container_id")
        ts = raw.get("ts", 0.0)
        if (not isinstance(raw.get("ready"), _OPT_BOOL)
                or not isinstance(raw.get("started"), _OPT_BOOL)
                or not isinstance(raw.get("liveness"), _OPT_STR)
                or not isinstance(raw.get("failed_probe"), _OPT_STR)
                or isinstance(ts, bool) or not isinstance(ts, int | float)):
            raise MapValueError("fields", "probe verdict: wrong field types")
        return cls(raw["container_id"], raw.get("ready"), raw.get("started"),
                   raw.get("liveness"), raw.get("failed_probe"), float(ts))


@dataclass(frozen=True)
class PodProbes:
    """A ``probes`` value: the verdicts of one pod's probed containers, by container name."""

    VERSION: ClassVar[int] = 1
    containers: Mapping[str, ContainerVerdict]

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.VERSION,
                "containers": {n: v.to_wire() for n, v in self.containers.items()}}

    @classmethod
    def from_wire(cls, raw: Any) -> PodProbes:
        if not isinstance(raw, Mapping):
            raise MapValueError("fields", "probes: not a map")
        if raw.get("v") != cls.VERSION:
            raise MapValueError("version", f"probes v{raw.get('v')!r}")
        containers = raw.get("containers")
        if not isinstance(containers, Mapping):
            raise MapValueError("fields", "probes: no containers")
        return cls({str(n): ContainerVerdict.from_wire(v) for n, v in containers.items()})

    @classmethod
    def from_entry(cls, entry: Mapping[str, Mapping[str, Any]]) -> PodProbes:
        """From the prober's own form (``{container name: verdict fields}``, also its file)."""
        return cls({str(n): ContainerVerdict.from_wire(v) for n, v in entry.items()})
