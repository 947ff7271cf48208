"""Fan-out of container events to GetContainerEvents subscribers. Publishing never blocks:
a subscriber whose bounded queue is full loses the event, and the loss is counted. Each event
is serialized once, whatever the number of subscribers (the server sends those bytes as they
are, server.py)."""

from __future__ import annotations

import contextlib
import queue
import threading

from cri_api.v1 import api_pb2 as pb

QUEUE_SIZE = 1024


_Item = tuple[pb.ContainerEventResponse, bytes]  # the event and its wire form


class Subscription:
    def __init__(self, owner: EventBroadcaster) -> None:
        self.queue: queue.Queue[_Item | None] = queue.Queue(QUEUE_SIZE)
        self._owner = owner
        self.closed = False

    def _next(self, timeout: float | None) -> _Item | None:
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def get(self, timeout: float | None = None) -> pb.ContainerEventResponse | None:
        """The next event; None on ``close()`` or after ``timeout`` (None: no timeout)."""
        item = self._next(timeout)
        return item[0] if item is not None else None

    def get_wire(self, timeout: float | None = None) -> bytes | None:
        """The next event, serialized; None as ``get``."""
        item = self._next(timeout)
        return item[1] if item is not None else None

    def close(self) -> None:
        self.closed = True
        self._owner.unsubscribe(self)
        with contextlib.suppress(queue.Full):
            self.queue.put_nowait(None)  # wake a blocked get()


class EventBroadcaster:
    def __init__(self, max_subscribers: int = 32) -> None:
        self._lock = threading.Lock()
        self._subs: list[Subscription] = []
        self.max_subscribers = max_subscribers
        self.dropped = 0

    def subscribe(self) -> Subscription | None:
        """A new subscription, or None when ``max_subscribers`` are already listening."""
        with self._lock:
            if len(self._subs) >= self.max_subscribers:
                return None
            sub = Subscription(self)
            self._subs.append(sub)
            return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    def active(self) -> bool:
        """Whether anyone listens (an event nobody gets need not be built)."""
        return bool(self._subs)

    def publish(self, event: pb.ContainerEventResponse) -> None:
        with self._lock:
            subs = list(self._subs)
        if not subs:
            return
        item = (event, event.SerializeToString())
        for sub in subs:
            try:
                sub.queue.put_nowait(item)
            except queue.Full:
                self.dropped += 1

    def close_all(self) -> None:
        with self._lock:
            subs = list(self._subs)
        for sub in subs:
            sub.close()
