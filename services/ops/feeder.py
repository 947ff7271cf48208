"""supervisord's event listener protocol, one listener's side of it (no I/O of its own).

The listener writes ``READY\\n``; the feeder sends one event: a header line
``ver:3.0 server:supervisor serial:N pool:NAME poolserial:N eventname:TYPE len:L\\n`` and L
bytes of payload; the listener answers ``RESULT 2\\nOK`` or ``RESULT 4\\nFAIL`` (a FAIL puts
the event back at the head of the queue, as supervisord rebuffers it), then ``READY`` again.
The queue is bounded: when full the oldest event is dropped and counted in ``dropped``.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

__all__ = ["EventFeeder", "ListenerState", "ProtocolError"]

QUEUE_MAX = 10_000


class ListenerState(enum.Enum):
    """supervisord's ``EventListenerStates``."""

    ACKNOWLEDGED = 30
    READY = 10
    BUSY = 20
    UNKNOWN = 40


class ProtocolError(RuntimeError):
    """The listener wrote something the protocol does not allow."""


@dataclass
class _Event:
    name: str
    payload: bytes
    serial: int


class EventFeeder:
    def __init__(self, pool: str, queue_max: int = QUEUE_MAX) -> None:
        self.pool = pool
        self.state = ListenerState.ACKNOWLEDGED
        self.queue: deque[_Event] = deque()
        self.queue_max = queue_max
        self.dropped = 0
        self.sent = 0
        self.failed = 0
        self._serial = 0
        self._buf = b""
        self._busy: _Event | None = None

    def push(self, name: str, payload: str) -> None:
        if len(self.queue) >= self.queue_max:
            self.queue.popleft()
            self.dropped += 1
        self._serial += 1
        self.queue.append(_Event(name, payload.encode(), self._serial))

    def feed(self, data: bytes) -> None:
        """Bytes the listener wrote on its stdout."""
        self._buf += data
        while True:
            if self.state in (ListenerState.ACKNOWLEDGED, ListenerState.READY):
                line, sep, rest = self._buf.partition(b"\n")
                if not sep:
                    return
                self._buf = rest
                if line.strip() != b"READY":
                    raise ProtocolError(f"expected READY, got {line[:80]!r}")
                self.state = ListenerState.READY
            else:  # BUSY: RESULT <len>\n<body>
                line, sep, rest = self._buf.partition(b"\n")
                if not sep:
                    return
                if not line.startswith(b"RESULT "):
                    raise ProtocolError(f"expected RESULT, got {line[:80]!r}")
                try:
                    size = int(line[7:])
                except ValueError:
                    raise ProtocolError(f"bad RESULT line {line[:80]!r}") from None
                if len(rest) < size:
                    return
                body, self._buf = rest[:size], rest[size:]
                event, self._busy = self._busy, None
                if body == b"OK":
                    self.sent += 1
                elif event is not None:  # FAIL (or anything else): rebuffer
                    self.failed += 1
                    self.queue.appendleft(event)
                self.state = ListenerState.ACKNOWLEDGED

    def next_message(self) -> bytes | None:
        """The bytes to write to the listener's stdin now (None: nothing to send)."""
        if self.state != ListenerState.READY or not self.queue:
            return None
        event = self.queue.popleft()
        self._busy, self.state = event, ListenerState.BUSY
        header = (f"ver:3.0 server:supervisor serial:{event.serial} pool:{self.pool} "
                  f"poolserial:{event.serial} eventname:{event.name} len:{len(event.payload)}\n")
        return header.encode() + event.payload
