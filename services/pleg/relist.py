"""The relist step (kubelet ``GenericPLEG.Relist``), without the bus: list, diff, inspect.

``Relister.relist()`` lists sandboxes and containers, derives events against the previous relist
with the pure ``generate_events``, inspects the pods that have events (or are new, or whose last
inspection failed) and returns what changed. Within such a pod only the sandboxes and containers
whose listed state changed since their last complete inspection are asked again. The caller
publishes events and map updates.

Thread-safety: one thread. Blind spot: a CRI call blocks up to the client's timeout; ``beat``
runs between calls, so one relist stalls the heartbeat for at most one call's timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from podvisor.services.cri import RuntimeClient
from podvisor.services.pleg.events import PodEvent, Snapshot, generate_events
from podvisor.services.pleg.records import (
    Beat,
    Inspected,
    group_by_pod,
    inspect_pod,
    snapshot_of,
)

Clock = Callable[[], float]


@dataclass(frozen=True)
class RelistResult:
    ts: float  # monotonic time the relist started
    duration: float  # seconds
    events: list[PodEvent]
    changed: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> new record
    removed: list[str] = field(default_factory=list)  # uids no longer in the runtime
    incomplete: list[str] = field(default_factory=list)  # uids to re-inspect next time


class Relister(Protocol):
    """Lists the runtime and reports what changed since the previous call."""

    def relist(self) -> RelistResult:
        """Raises ``CriError`` when listing fails (nothing changes then)."""

    def records(self) -> dict[str, dict[str, Any]]:
        """The current record of every pod (the ``pleg`` map's content, without ``_health``)."""


def _without_ts(record: dict[str, Any] | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {k: v for k, v in record.items() if k != "ts"}


class _Relister:
    def __init__(self, client: RuntimeClient, clock: Clock, beat: Beat) -> None:
        self._client = client
        self._clock = clock
        self._beat = beat
        self._snapshot: Snapshot = {}
        self._records: dict[str, dict[str, Any]] = {}
        self._reinspect: set[str] = set()
        self._inspected: Inspected = {}  # complete inspections, reused while the state holds

    def records(self) -> dict[str, dict[str, Any]]:
        return dict(self._records)

    def relist(self) -> RelistResult:
        start = self._clock()
        sandboxes = self._client.list_pod_sandbox()
        self._beat()
        containers = self._client.list_containers()
        self._beat()
        pods = group_by_pod(sandboxes, containers)
        snapshot = snapshot_of(pods)
        events = generate_events(self._snapshot, snapshot)
        wanted = {e.pod_uid for e in events} | self._reinspect | (pods.keys() - self._records)
        changed: dict[str, dict[str, Any]] = {}
        reinspect: set[str] = set()
        for uid in sorted(wanted & pods.keys()):
            record, complete = inspect_pod(self._client, pods[uid], start, self._beat,
                                           self._inspected)
            if not complete:
                reinspect.add(uid)
            if _without_ts(record) != _without_ts(self._records.get(uid)):
                changed[uid] = record
                self._records[uid] = record
        removed = sorted(self._records.keys() - pods.keys())
        for uid in removed:
            del self._records[uid]
        if len(self._inspected) > sum(len(states) for states in snapshot.values()):
            live = {oid for states in snapshot.values() for oid in states}
            self._inspected = {k: v for k, v in self._inspected.items() if k in live}
        self._snapshot = snapshot
        self._reinspect = reinspect
        return RelistResult(start, self._clock() - start, events, changed, removed,
                            sorted(reinspect))


def new_relister(
    client: RuntimeClient, clock: Clock = time.monotonic, beat: Beat = lambda: None
) -> Relister:
    return _Relister(client, clock, beat)
