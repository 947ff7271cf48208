"""Publishing events without losing the first ones to ZeroMQ's slow-joiner gap.

A PUB socket drops what it sends before the proxy has passed it the subscribers' topics, and a
source reports its invalid manifests right after it starts. So events go out on their own XPUB
socket: an XPUB sees the subscriptions arriving (``\\x01<topic>``), and this class holds events
(at most ``limit``, oldest dropped and counted) until someone subscribes to ``events.``, then
sends them, never blocking. One thread (the owner's loop); call ``pump()`` from it regularly.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import zmq

from podvisor.ipc.clock import SYSTEM_CLOCK, Clock
from podvisor.ipc.codec import Codec
from podvisor.ipc.messages import Event, Message
from podvisor.ipc.paths import RunPaths

LIMIT = 1000
_TOPIC = Event.TOPIC.encode()


class EventPublisher:
    def __init__(self, zctx: zmq.Context[Any], paths: RunPaths, source: str,
                 limit: int = LIMIT, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.source = source
        self._clock = clock
        self._codec = Codec()
        self._seq = 0
        self._held: deque[Message] = deque()
        self._limit = limit
        self.subscribed = False
        self.dropped = 0
        self.sent = 0
        self.socket = zctx.socket(zmq.XPUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, 10_000)
        self.socket.connect(paths.bus_pub)

    def send(self, msg: Message) -> bool:
        """Queue ``msg`` and send what can go now. False when the queue was full (the oldest
        held event was dropped to make room)."""
        full = len(self._held) >= self._limit
        if full:
            self._held.popleft()
            self.dropped += 1
        self._held.append(msg)
        self.pump()
        return not full

    def pump(self) -> None:
        self._read_subscriptions()
        while self.subscribed and self._held:
            self._seq += 1
            frames = self._codec.encode(self._held[0], self.source, self._seq,
                                        self._clock.monotonic(), None)
            try:
                self.socket.send_multipart(frames, flags=zmq.NOBLOCK)
            except zmq.Again:
                return  # the proxy is slow: try again on the next pump
            self._held.popleft()
            self.sent += 1

    def _read_subscriptions(self) -> None:
        # called on every turn of the owner's loop: ask for pending input first (an empty
        # non-blocking recv costs a raised zmq.Again)
        if not self.socket.get(zmq.EVENTS) & zmq.POLLIN:
            return
        while True:
            try:
                frame = self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if frame[:1] == b"\x01" and _TOPIC.startswith(frame[1:]):
                self.subscribed = True

    def close(self) -> None:
        self.socket.close(linger=0)
