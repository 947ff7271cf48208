"""Liveness messages from children to the supervisor: PUSH (child) -> PULL (`paths.heartbeat`).

Wire form: one frame, msgpack array `[1, kind, name, pid, ts]` with kind `"ready"` (sent once,
after the service module imported) or `"heartbeat"`, `ts` the child's monotonic time. The
supervisor matches `pid` to the current incarnation, so beats from a previous one are ignored.
This socket is point-to-point, not the bus, so it does not go through `podvisor.ipc.codec`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import msgpack
import zmq

__all__ = ["BEAT", "READY", "Beat", "HeartbeatSender", "decode_beat", "encode_beat"]

READY = "ready"
BEAT = "heartbeat"
_WIRE_VERSION = 1


@dataclass(frozen=True)
class Beat:
    kind: str
    name: str
    pid: int
    ts: float


def encode_beat(beat: Beat) -> bytes:
    packed: bytes = msgpack.packb([_WIRE_VERSION, beat.kind, beat.name, beat.pid, beat.ts])
    return packed


def decode_beat(data: bytes) -> Beat | None:
    """The beat, or None when `data` is not a well-formed beat (never raises)."""
    if len(data) > 1024:
        return None
    try:
        raw = msgpack.unpackb(data)
    except Exception:
        return None
    if not isinstance(raw, list) or len(raw) != 5 or raw[0] != _WIRE_VERSION:
        return None
    _, kind, name, pid, ts = raw
    if kind not in (READY, BEAT) or not isinstance(name, str):
        return None
    if isinstance(pid, bool) or not isinstance(pid, int) or not isinstance(ts, int | float):
        return None
    return Beat(kind, name, pid, float(ts))


class HeartbeatSender:
    """Sends `ready` once and rate-limited heartbeats. Never blocks: a full queue drops the beat
    (the next one will do). Owned by one thread (the child's main thread)."""

    def __init__(
        self,
        zctx: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        name: str,
        pid: int,
        min_interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._name = name
        self._pid = pid
        self._min_interval = min_interval
        self._clock = clock
        self._last = float("-inf")
        self.dropped = 0
        self._sock = zctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 16)
        self._sock.connect(endpoint)

    def _send(self, kind: str) -> bool:
        now = self._clock()
        try:
            self._sock.send(encode_beat(Beat(kind, self._name, self._pid, now)), zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1
            return False
        self._last = now
        return True

    def ready(self) -> bool:
        return self._send(READY)

    def beat(self) -> bool:
        """Send a heartbeat unless one went out less than `min_interval` ago."""
        if self._clock() - self._last < self._min_interval:
            return False
        return self._send(BEAT)

    def close(self) -> None:
        self._sock.close(linger=0)
