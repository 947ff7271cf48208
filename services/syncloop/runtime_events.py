"""The sync loop's own GetContainerEvents stream: a container that stopped syncs its pod at once.

Without it a death reaches the pod's worker in four process hops (runtime -> PLEG relist ->
bus -> sync loop). With it the runtime tells the sync loop directly, like supervisord's own
SIGCHLD; PLEG's ``pleg.pod.event`` stays the trigger for runtimes without the stream
(containerd 1.6 answers UNIMPLEMENTED: the watcher then stops for the life of the process) and
the fallback when the stream is down (retried 1 s doubling to 30 s). The stream thread is PLEG's
``EventWatcher`` (bounded queue, drops counted, wake fd polled by the main loop).

Only CONTAINER_STOPPED events trigger: a start, a create or a removal is the sync loop's own
doing and needs no sync.
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
    """A started watcher of ``client``'s event stream; poll ``wake_fd``, then ``stopped_pods``
    of ``drain()``; ``stop()`` at exit."""
    watcher = EventWatcher(client, _Renamed(log))
    watcher.start()
    return watcher


def stopped_pods(events: Iterable[Any]) -> list[str]:
    """Pod UIDs of the CONTAINER_STOPPED events (in order, once each); other items (None marks
    a stream mode change) are skipped."""
    out: dict[str, None] = {}
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
            out[uid] = None
    return list(out)
