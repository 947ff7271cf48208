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
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import RuntimeClient
from podvisor.services.pleg.stream import EventWatcher
from podvisor.services.syncloop import labels as L
from podvisor.supervisor.logs import EventLog


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


def stopped_containers(events: Iterable[Any]) -> list[tuple[str, str]]:
    """(pod UID, container ID) of each CONTAINER_STOPPED event, in order; other items (None
    marks a stream mode change) are skipped."""
    out: list[tuple[str, str]] = []
    for event in events:
        if not isinstance(event, pb.ContainerEventResponse):
            continue
        if event.container_event_type != pb.CONTAINER_STOPPED_EVENT:
            continue
        uid = ""
        for status in event.containers_statuses:
            uid = status.labels.get(L.POD_UID, "")
        if not uid and event.HasField("pod_sandbox_status"):
            uid = event.pod_sandbox_status.metadata.uid
        if uid:
            out.append((uid, event.container_id))
    return out


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
