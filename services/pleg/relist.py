"""The relist step (kubelet ``GenericPLEG.Relist``), without the bus: list, diff, inspect.

``Relister.relist()`` lists sandboxes and containers, derives events against the previous relist
with the pure ``generate_events``, inspects the pods that have events (or are new, or whose last
inspection failed) and returns what changed. Within such a pod only the sandboxes and containers
whose listed state changed since their last complete inspection are asked again. The caller
publishes events and map updates.

``Relister.apply_events(events, ts)`` is the Evented PLEG path (``evented.py``): it updates the
same state (snapshot, records, inspection cache) from GetContainerEvents events alone, without a
CRI call, so the next relist finds nothing new. Lifecycle events are diffed between what was
published and the pod's new record, as a relist diffs two listings: a pod that shows a container
just created (CONTAINER_CREATED, never published) is held until that container starts or exits,
at most ``HOLD`` seconds, so a create + start publishes one update and one ContainerStarted, not
a CREATED state every consumer would recompute for a few ms (a relist seldom sees it either).
IDs removed by a relist or an event are kept for ``DEAD_TTL`` seconds so that a stale event
(taken before a relist, applied after it) cannot bring them back.

Thread-safety: one thread. Blind spot: a CRI call blocks up to the client's timeout; ``beat``
runs between calls, so one relist stalls the heartbeat for at most one call's timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from cri_api.v1 import api_pb2 as pb

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.services.cri import RuntimeClient
from podvisor.services.pleg.evented import apply_event, event_pod_uid, states_of
from podvisor.services.pleg.events import ContainerState, PodEvent, generate_events
from podvisor.services.pleg.records import (
    Beat,
    Inspected,
    group_by_pod,
    inspect_pod,
    snapshot_of,
)

Clock = Callable[[], float]
DEAD_TTL = 120.0  # seconds a removed ID stays known (far longer than any event stays queued)
HOLD = 1.0  # seconds a pod's update waits while it shows a container just created (see above)


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

    def apply_events(self, events: Iterable[pb.ContainerEventResponse], ts: float
                     ) -> RelistResult:
        """Apply stream events in order (no CRI call) and return what to publish; ``ts`` is
        the records' and events' time (``RelistResult.ts``)."""

    def flush(self, now: float) -> RelistResult:
        """Publish the held updates whose ``HOLD`` is over."""

    def held_until(self) -> float | None:
        """When the oldest held update is due (None: nothing held)."""


_MISSING = object()


def _changed(record: dict[str, Any], old: dict[str, Any] | None) -> bool:
    """Whether ``record`` differs from ``old`` in anything but ``ts`` (no copies made)."""
    if old is None or len(old) != len(record):
        return True
    return any(k != "ts" and old.get(k, _MISSING) != v for k, v in record.items())


class _Relister:
    def __init__(self, client: RuntimeClient, clock: Clock, beat: Beat,
                 wall_ns: Callable[[], int]) -> None:
        self._client = client
        self._clock = clock
        self._wall_ns = wall_ns
        self._listed_at = 0  # wall ns when the last successful relist started
        self._beat = beat
        self._snapshot: dict[str, dict[str, ContainerState]] = {}
        self._records: dict[str, dict[str, Any]] = {}
        self._reinspect: set[str] = set()
        self._inspected: Inspected = {}  # complete inspections, reused while the state holds
        self._dead: dict[str, float] = {}  # removed object ID -> when it was seen removed
        # applied but not yet published (held): pod UID -> (record or None, held since)
        self._held: dict[str, tuple[dict[str, Any] | None, float]] = {}
        self._held_min: float | None = None  # min(since) of ``_held``; None: to compute

    def records(self) -> dict[str, dict[str, Any]]:
        return dict(self._records)

    def relist(self) -> RelistResult:
        start = self._clock()
        listed_at = self._wall_ns()
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
            if _changed(record, self._records.get(uid)):
                changed[uid] = record
                self._records[uid] = record
        removed = sorted(self._records.keys() - pods.keys())
        for uid in removed:
            del self._records[uid]
        live = {oid for states in snapshot.values() for oid in states}
        for oid in {oid for states in self._snapshot.values() for oid in states} - live:
            self._dead[oid] = start
        self._dead = {k: t for k, t in self._dead.items() if start - t < DEAD_TTL}
        if len(self._inspected) > len(live):
            self._inspected = {k: v for k, v in self._inspected.items() if k in live}
        self._snapshot = {uid: dict(states) for uid, states in snapshot.items()}
        self._listed_at = listed_at
        self._reinspect = reinspect
        self._held.clear()  # the listing is newer than any held update
        self._held_min = None
        return RelistResult(start, self._clock() - start, events, changed, removed,
                            sorted(reinspect))


    def apply_events(self, events: Iterable[pb.ContainerEventResponse], ts: float
                     ) -> RelistResult:
        start = self._clock()
        touched: dict[str, None] = {}  # pod UIDs in event order
        for event in events:
            uid = event_pod_uid(event) or self._owner_of(event.container_id)
            if not uid:
                continue  # not podvisor's (no pod UID label), or gone already
            held = self._held.get(uid)
            old = held[0] if held is not None else self._records.get(uid)
            update = apply_event(event, old, ts, self._dead, self._listed_at)
            for oid in update.removed:
                self._dead.setdefault(oid, ts)
                self._inspected.pop(oid, None)
            self._inspected.update(update.fresh)
            if held is None:
                self._held[uid] = (update.record, ts)
                if self._held_min is not None:
                    self._held_min = min(self._held_min, ts)
            else:
                self._held[uid] = (update.record, held[1])
            touched[uid] = None
        return self._publishable(touched, ts, start)

    def flush(self, now: float) -> RelistResult:
        start = self._clock()
        due = [uid for uid, (_record, since) in self._held.items() if since + HOLD <= now]
        return self._publishable(due, now, start)

    def held_until(self) -> float | None:
        # the loop asks two or three times per wake-up: keep the minimum, not a scan each time
        if self._held_min is None and self._held:
            self._held_min = min(since for _record, since in self._held.values())
        return None if not self._held or self._held_min is None else self._held_min + HOLD

    def _publishable(self, uids: Iterable[str], ts: float, start: float) -> RelistResult:
        """Publish the applied state of ``uids`` (events diffed against what was published),
        except pods held for a container just created (``HOLD``)."""
        out: list[PodEvent] = []
        changed: dict[str, dict[str, Any]] = {}
        removed: list[str] = []
        for uid in uids:
            record, since = self._held[uid]
            published = self._snapshot.get(uid, {})
            if ts - since < HOLD and _new_created(record, published):
                continue
            del self._held[uid]
            if since == self._held_min:
                self._held_min = None  # it may have been the oldest
            states = states_of(record)
            out.extend(generate_events({uid: published}, {uid: states}))
            if record is None:
                self._snapshot.pop(uid, None)
                if self._records.pop(uid, None) is not None:
                    removed.append(uid)
                continue
            self._snapshot[uid] = states
            if _changed(record, self._records.get(uid)):
                self._records[uid] = changed[uid] = record
        return RelistResult(ts, self._clock() - start, out, changed, sorted(removed))

    def _owner_of(self, object_id: str) -> str:
        """The pod an object belongs to (an event without a sandbox status)."""
        for uid, states in self._snapshot.items():
            if object_id in states:
                return uid
        for uid, (record, _since) in self._held.items():
            if object_id in states_of(record):
                return uid
        return ""


def _new_created(record: dict[str, Any] | None, published: dict[str, ContainerState]) -> bool:
    """Whether ``record`` shows a container in CREATED state that was never published."""
    return record is not None and any(
        c["state"] == "CONTAINER_CREATED" and c["id"] not in published
        for c in record["containers"])


def new_relister(
    client: RuntimeClient, clock: Clock = SYSTEM_CLOCK.monotonic, beat: Beat = lambda: None,
    wall_ns: Callable[[], int] = SYSTEM_CLOCK.wall_ns,
) -> Relister:
    """``wall_ns``: the clock of the runtime's event ``created_at`` (CLOCK_REALTIME, ns)."""
    return _Relister(client, clock, beat, wall_ns)
