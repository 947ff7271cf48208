"""Recording events from any thread; publishing them from the thread that owns the publisher.

zmq sockets belong to one thread, while the sync loop's pod workers run on a pool. So
``Recorder.record`` only appends to a thread-safe queue, and the owner of the ``Publisher``
calls ``flush(sink)`` from its loop (an ``EventPublisher``: never blocks, holds events until
the keeper has subscribed).
"""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.messages import Event, Message
from podvisor.services.events.model import new_event


class Sink(Protocol):
    """Where ``flush`` sends (an ``EventPublisher``; tests use a list)."""

    def send(self, msg: Message) -> bool: ...

    def pump(self) -> None: ...


Resolve = Callable[[dict[str, Any]], dict[str, Any]]


class Recorder:
    """``record(type, reason, message, object)`` from any thread; ``flush(sink)`` from one.
    ``resolve`` (called by ``flush``, on the owner's thread) may fill in an object's missing
    name/namespace from its uid."""

    def __init__(self, source: str, wall: Callable[[], float] = SYSTEM_CLOCK.wall,
                 resolve: Resolve | None = None) -> None:
        self.source = source
        self._wall = wall
        self._queue: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.resolve = resolve
        self.sent = 0
        self.dropped = 0

    def record(self, type_: str, reason: str, message: str, obj: Mapping[str, Any]) -> None:
        self._queue.put(new_event(type_, reason, message, obj, self.source, self._wall()))

    def pending(self) -> int:
        return self._queue.qsize()

    def flush(self, sink: Sink) -> int:
        """Hand everything recorded so far to ``sink`` (and let it send what it holds);
        returns how many were accepted."""
        sent = 0
        while True:
            try:
                event = self._queue.get_nowait()
            except queue.Empty:
                sink.pump()
                return sent
            if self.resolve is not None:
                # resolving is best effort; the event goes out anyway
                with contextlib.suppress(Exception):
                    event = _with_object(event, self.resolve(dict(event.object)))
            if sink.send(event):
                sent += 1
                self.sent += 1
            else:
                self.dropped += 1


def _with_object(event: Event, obj: dict[str, Any]) -> Event:
    return Event(type=event.type, reason=event.reason, message=event.message, object=obj,
                 source=event.source, count=event.count, first_ts=event.first_ts,
                 last_ts=event.last_ts)
