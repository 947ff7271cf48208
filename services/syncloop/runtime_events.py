"""The sync loop's own GetContainerEvents stream: a container that stopped syncs its pod at once.

Without it a death reaches the pod's worker in four process hops (runtime -> PLEG relist ->
bus -> sync loop). With it the runtime tells the sync loop directly, like supervisord's own
SIGCHLD; PLEG's ``pleg.pod.event`` stays the trigger for runtimes without the stream
(containerd 1.6 answers UNIMPLEMENTED: the watcher then stops for the life of the process) and
the fallback when the stream is down (retried 1 s doubling to 30 s). The stream thread is PLEG's
``EventWatcher`` (bounded queue, drops counted, wake fd polled by the main loop).

Only CONTAINER_STOPPED events trigger: a start, a create or a removal is the sync loop's own
doing and needs no sync. PLEG's ContainerDied of a container the stream already reported is
skipped (``SeenStops``), so a death costs one sync, not two.

The event is also the pod's state (like the kubelet's Evented PLEG, which updates its pod cache
from the event): it carries the sandbox's status and the full ContainerStatus of every container
of that sandbox, one consistent snapshot. The sync it triggers uses it instead of reading the
runtime (``runtime_from_event``) when that is safe: the event is the newest one seen for the pod
(a later event of the pod replaces it), nothing else asked for that sync, the event's sandbox is
the worker's current one and READY, it lists every container of the pod spec (older sandboxes'
containers are not in it) and it already shows what the worker's last sync did (``Effects``: the
containers it started, stopped or removed), so an event published before that sync's changes is
never acted on twice. Otherwise the sync reads the runtime as before.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cri_api.v1 import api_pb2 as pb

from podvisor.common.logs import EventLog
from podvisor.services.cri import RuntimeClient
from podvisor.services.pleg import EventWatcher
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.runtime_state import (
    PodRuntime,
    SandboxInfo,
    container_from_status,
    newest_first,
)


class _Renamed:
    """The watcher's ``pleg.events_*`` log events, named as the sync loop's."""

    def __init__(self, log: EventLog) -> None:
        self._log = log

    def _name(self, event: str) -> str:
        return "syncloop." + event.removeprefix("pleg.")

    def info(self, event: str, **fields: Any) -> None:
        self._log.info(self._name(event), **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log.warning(self._name(event), **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log.error(self._name(event), **fields)

    def debug(self, event: str, **fields: Any) -> None:
        self._log.debug(self._name(event), **fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._log.exception(self._name(event), **fields)

    def bind(self, **fields: Any) -> EventLog:
        return _Renamed(self._log.bind(**fields))


def new_stop_watcher(client: RuntimeClient, log: EventLog) -> EventWatcher:
    """A started watcher of ``client``'s event stream; poll ``wake_fd``, then
    ``stopped_containers`` of ``drain()``; ``stop()`` at exit."""
    watcher = EventWatcher(client, _Renamed(log))
    watcher.start()
    return watcher


def event_pod_uid(event: pb.ContainerEventResponse) -> str:
    for status in event.containers_statuses:
        if uid := str(status.labels.get(L.POD_UID, "")):
            return uid
    if event.HasField("pod_sandbox_status"):
        sb = event.pod_sandbox_status
        return str(sb.labels.get(L.POD_UID, "")) or sb.metadata.uid
    return ""


def pod_events(events: Iterable[Any]) -> list[tuple[str, pb.ContainerEventResponse]]:
    """(pod UID, event) of each container event naming a pod, in order; other items (None
    marks a stream mode change) are skipped."""
    out: list[tuple[str, pb.ContainerEventResponse]] = []
    for event in events:
        if isinstance(event, pb.ContainerEventResponse) and (uid := event_pod_uid(event)):
            out.append((uid, event))
    return out


def event_mono(event: pb.ContainerEventResponse, now_mono: float,
               now_wall: float) -> float | None:
    """When the runtime published the event (after taking its snapshot), on the monotonic
    clock; None when the event has no time."""
    if event.created_at <= 0:
        return None
    return now_mono - (now_wall - event.created_at / 1e9)


def is_stop(event: pb.ContainerEventResponse) -> bool:
    return event.container_event_type == pb.CONTAINER_STOPPED_EVENT


def stopped_containers(events: Iterable[Any]) -> list[tuple[str, str]]:
    """(pod UID, container ID) of each CONTAINER_STOPPED event, in order."""
    return [(uid, e.container_id) for uid, e in pod_events(events) if is_stop(e)]


class Effect(StrEnum):
    """What a sync did to a container, as a later snapshot must show it."""

    STARTED = "started"   # listed, no longer CREATED
    STOPPED = "stopped"   # listed and not running, or gone
    REMOVED = "removed"   # gone


Effects = Mapping[str, Effect]  # container ID -> what the sync did to it


@dataclass(frozen=True)
class EventSnapshot:
    """A sync's runtime state offered by a stream event, with what it must agree with."""

    event: pb.ContainerEventResponse
    sandbox_id: str | None   # the worker's current sandbox (its last successful sync's)
    effects: Effects         # what the worker's last syncs did
    # containers the stream reported stopped since the last sync was handed out: the state
    # must show them stopped too (two threads' events may be published out of order)
    stops: frozenset[str] = frozenset()


def _shows(statuses: Mapping[str, pb.ContainerStatus], snap: EventSnapshot) -> bool:
    for cid in snap.stops:
        s = statuses.get(cid)
        if s is not None and s.state == pb.CONTAINER_RUNNING:
            return False
    for cid, effect in snap.effects.items():
        s = statuses.get(cid)
        if effect is Effect.REMOVED and s is not None:
            return False
        if effect is Effect.STARTED and (s is None or s.state == pb.CONTAINER_CREATED):
            return False
        if effect is Effect.STOPPED and s is not None and s.state == pb.CONTAINER_RUNNING:
            return False
    return True


def runtime_from_event(snap: EventSnapshot, names: Collection[str], now_mono: float,
                       now_wall: float) -> tuple[PodRuntime | None, str]:
    """The pod's runtime state from the event, or (None, why not) when the sync must read the
    runtime. ``names``: the pod spec's container names (init ones included)."""
    event = snap.event
    if not event.HasField("pod_sandbox_status"):
        return None, "no sandbox status"
    sb = event.pod_sandbox_status
    if not snap.sandbox_id or sb.id != snap.sandbox_id:
        return None, "not the current sandbox"
    if sb.state != pb.SANDBOX_READY:
        return None, "sandbox not ready"
    statuses = {s.id: s for s in event.containers_statuses}
    if not _shows(statuses, snap):
        return None, "older than the last sync"
    containers = [container_from_status(s, sb.id, now_mono, now_wall)
                  for s in statuses.values()]
    if not set(names) <= {c.name for c in containers}:
        return None, "a container of the spec is missing"
    box = SandboxInfo(sb.id, True, sb.metadata.attempt, sb.created_at)
    return PodRuntime((box,), newest_first(containers)), ""


class SeenStops:
    """Container IDs the stream reported stopped (the last ``size``): PLEG's ContainerDied for
    one of them is old news (the pod was synced on the stream's event)."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._ids: dict[str, None] = {}

    def add(self, container_id: str) -> None:
        self._ids[container_id] = None
        if len(self._ids) > self._size:
            del self._ids[next(iter(self._ids))]

    def __contains__(self, container_id: object) -> bool:
        return container_id in self._ids
