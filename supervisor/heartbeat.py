"""Liveness from children to the supervisor.

`ready` (sent once, after the service module imported) travels PUSH (child) -> PULL
(`paths.heartbeat`): one frame, msgpack array `[1, kind, name, pid, ts]` with kind `"ready"` or
`"heartbeat"`, `ts` the child's monotonic time. This socket is point-to-point, not the bus, so it
does not go through `podvisor.ipc.codec`.

Periodic heartbeats are a memory write: each child maps `run/beat-<name>` (16 bytes: pid, beat
count; `BeatSlot`) and bumps the count; the supervisor maps the same file read-only
(`BeatReader`) and reads it when it drains heartbeats. A zmq beat cost ~0.2 ms of CPU per beat
across the child's main and I/O threads and the supervisor's I/O thread (each woken once a
second per child); a memory write wakes nobody. A child that cannot map its file sends its beats
over PUSH as before. Either way the supervisor matches `pid` to the current incarnation, so
beats from a previous one are ignored.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgpack
import zmq

__all__ = ["BEAT", "READY", "Beat", "BeatReader", "BeatSlot", "HeartbeatSender", "beat_file",
           "decode_beat", "encode_beat"]

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


_SLOT = struct.Struct("=qq")  # pid, beat count
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,100}")


def beat_file(run_dir: Path, name: str) -> Path | None:
    """The shared heartbeat file of process `name` (None for a name unfit for a file name)."""
    return run_dir / f"beat-{name}" if _SAFE_NAME.fullmatch(name) else None


class BeatSlot:
    """The child's side: `beat()` is a 16-byte memory write into `path` (created if missing,
    never truncated: the supervisor may hold it mapped). Raises OSError if it cannot be
    mapped."""

    def __init__(self, path: Path, pid: int) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            if os.fstat(fd).st_size < _SLOT.size:
                os.ftruncate(fd, _SLOT.size)
            self._map = mmap.mmap(fd, _SLOT.size)
        finally:
            os.close(fd)
        self._pid = pid
        self.count = 0

    def beat(self) -> None:
        self.count += 1
        _SLOT.pack_into(self._map, 0, self._pid, self.count)

    def close(self) -> None:
        self._map.close()


class BeatReader:
    """The supervisor's side: `new_beat(name, pid)` is True when `pid` has bumped its count
    since the last call. A mapping that has shown nothing new for `reopen_after` seconds is
    dropped and the file mapped again at the next call (it may have been replaced, or a new
    incarnation may not have created it yet)."""

    def __init__(self, run_dir: Path, reopen_after: float = 2.0, *,
                 clock: Callable[[], float]) -> None:
        self._dir = run_dir
        self.reopen_after = reopen_after
        self._clock = clock
        self._maps: dict[str, mmap.mmap] = {}
        self._seen: dict[str, tuple[int, int, float]] = {}  # name -> pid, count, when

    def new_beat(self, name: str, pid: int) -> bool:
        view = self._maps.get(name) or self._open(name)
        if view is None:
            return False
        got_pid, count = _SLOT.unpack_from(view, 0)
        now = self._clock()
        seen = self._seen.get(name)
        if got_pid == pid and (seen is None or seen[:2] != (pid, count)):
            self._seen[name] = (pid, count, now)
            return True
        if seen is None or now - seen[2] >= self.reopen_after:
            self._forget(name)
        return False

    def _open(self, name: str) -> mmap.mmap | None:
        path = beat_file(self._dir, name)
        if path is None:
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size < _SLOT.size:
                return None
            view = mmap.mmap(fd, _SLOT.size, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        self._maps[name] = view
        return view

    def _forget(self, name: str) -> None:
        view = self._maps.pop(name, None)
        if view is not None:
            view.close()

    def close(self) -> None:
        for name in list(self._maps):
            self._forget(name)


class HeartbeatSender:
    """Sends `ready` once (PUSH) and rate-limited heartbeats (a `BeatSlot` write when
    `beat_path` can be mapped, else PUSH). Never blocks: a full queue drops the beat (the next
    one will do). Owned by one thread (the child's main thread)."""

    def __init__(
        self,
        zctx: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        name: str,
        pid: int,
        min_interval: float,
        clock: Callable[[], float],
        beat_path: Path | None = None,
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
        self._beat_path = beat_path
        self.slot: BeatSlot | None = None

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
        now = self._clock()
        if now - self._last < self._min_interval:
            return False
        if self._beat_path is not None:  # first beat: map the slot (after `ready`)
            path, self._beat_path = self._beat_path, None
            with contextlib.suppress(OSError):
                self.slot = BeatSlot(path, self._pid)
        if self.slot is not None:
            self.slot.beat()
            self._last = now
            return True
        return self._send(BEAT)

    def close(self) -> None:
        if self.slot is not None:
            self.slot.close()
        self._sock.close(linger=0)
