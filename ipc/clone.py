"""Replicated maps, as in the ZeroMQ Guide's Clone pattern.

The owner keeps the authoritative ``key -> value`` map. Each change gets the next sequence number
and is published on the bus as a ``MapUpdate`` (topic ``clone.<map>.update``); when idle the owner
publishes a ``MapHeartbeat`` carrying its current sequence: ``heartbeat_interval`` after its last
message, then at doubling intervals up to ``idle_heartbeat_max`` (a lost tail update is still
found one interval after it; a map that has not changed for a while costs its replicas one
wake-up per ``idle_heartbeat_max``, not one per interval). The owner also answers snapshot
requests on a ROUTER socket at ``paths.snapshot(map)``.

A replica subscribes first, then asks for a snapshot, then applies the updates it buffered whose
sequence is above the snapshot's. It asks again whenever it sees a gap in the sequence, a heartbeat
ahead of what it has, or a new owner epoch (the owner restarted and rebuilt its map). So a killed
subscriber, a slow joiner or a lost message loses nothing once the next snapshot lands.

Thread-safety: owner and replica each belong to one thread, like their sockets.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgpack
import zmq

from podvisor.ipc.bus import Publisher, Subscriber
from podvisor.ipc.busgate import BusGate
from podvisor.ipc.clock import Clock
from podvisor.ipc.codec import Envelope
from podvisor.ipc.maps import MapSpec, MapValueError, UndeclaredMap
from podvisor.ipc.messages import MapHeartbeat, MapUpdate
from podvisor.ipc.paths import RunPaths

T = TypeVar("T")
# on_change(key, old, new): None for a key that was absent, or is now deleted
OnChange = Callable[[str, T | None, T | None], None]
SNAPSHOT_MAX_BYTES = 256 * 1024 * 1024
REPLICA_BUFFER = 100_000


def _topic(map_name: str) -> str:
    return f"clone.{map_name}."


def _spec(spec: MapSpec[T]) -> MapSpec[T]:
    """``spec``, or ``UndeclaredMap`` for anything else (a bare map name: no raw maps)."""
    if not isinstance(spec, MapSpec):
        raise UndeclaredMap(f"map {spec!r} has no MapSpec: declare it in ipc/maps.py "
                            "(a map is read and written only through its declared type)")
    return spec

IDLE_HEARTBEAT_MAX = 8.0  # seconds between idle heartbeats of a map that stopped changing


class MapOwner(Generic[T]):
    """The authoritative copy of one map (its values of the spec's type ``T``, sent in their
    wire form). Call ``serve()`` whenever ``socket`` is readable and ``tick(now)`` from the
    owner's loop (it sends the idle heartbeat)."""

    def __init__(
        self, zctx: zmq.Context[zmq.Socket[bytes]], paths: RunPaths, publisher: Publisher,
        spec: MapSpec[T], heartbeat_interval: float = 1.0, *, clock: Clock,
        idle_heartbeat_max: float = IDLE_HEARTBEAT_MAX,
    ) -> None:
        self.spec = _spec(spec)
        self.map_name = map_name = spec.name
        self._encode = spec.encode
        self.epoch = os.urandom(8).hex()
        self.seq = 0
        self._items: dict[str, T] = {}
        self._pub = publisher
        self._clock = clock
        self._hb_interval = heartbeat_interval
        self._hb_max = max(heartbeat_interval, idle_heartbeat_max)
        self._hb_delay = heartbeat_interval
        self._last_sent = clock.monotonic()
        self.socket = zctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(paths.snapshot(map_name))

    def items(self) -> dict[str, T]:
        return dict(self._items)

    def get(self, key: str) -> T | None:
        return self._items.get(key)

    def set(self, key: str, value: T) -> bool:
        """Store ``value``; publishes only when it differs. Returns whether it changed."""
        if key in self._items and self._items[key] == value:
            return False
        self._items[key] = value
        self._send(key, value, deleted=False)
        return True

    def delete(self, key: str) -> bool:
        if key not in self._items:
            return False
        del self._items[key]
        self._send(key, None, deleted=True)
        return True

    def _send(self, key: str, value: T | None, deleted: bool) -> None:
        self.seq += 1
        wire = None if value is None else self._encode(value)
        msg = MapUpdate(map=self.map_name, epoch=self.epoch, seq=self.seq, key=key, value=wire,
                        deleted=deleted)
        self._pub.publish(msg, topic=_topic(self.map_name) + "update")
        self._last_sent = self._clock.monotonic()
        self._hb_delay = self._hb_interval

    def next_tick(self) -> float:
        """When ``tick`` will next send the idle heartbeat (for a loop's poll timeout)."""
        return self._last_sent + self._hb_delay

    def tick(self, now: float) -> None:
        if now - self._last_sent >= self._hb_delay:
            self._pub.publish(MapHeartbeat(map=self.map_name, epoch=self.epoch, seq=self.seq),
                              topic=_topic(self.map_name) + "heartbeat")
            self._last_sent = now
            self._hb_delay = min(self._hb_max, self._hb_delay * 2)

    def serve(self) -> int:
        """Answer every pending snapshot request without blocking; returns how many."""
        served = 0
        while True:
            try:
                frames = self.socket.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return served
            if len(frames) < 2:
                continue  # malformed request: nothing to answer
            items = {k: self._encode(v) for k, v in self._items.items()}
            snapshot = {"map": self.map_name, "epoch": self.epoch, "seq": self.seq,
                        "items": items}
            self.socket.send_multipart([frames[0], msgpack.packb(snapshot, use_bin_type=True)])
            served += 1

    def close(self) -> None:
        self.socket.close(linger=0)


class MapReplica(Generic[T]):
    """A follower's copy of one map, its values decoded to the spec's type ``T`` (a value the
    spec does not read is dropped and counted in ``value_drops``). Poll ``sockets`` (the update
    SUB and the snapshot DEALER); call ``pump()`` when either is readable and from time to time
    (it re-asks an owner that did not answer). ``pump`` never blocks longer than its timeout:
    snapshots are asked for and received asynchronously; ``sync()`` is the blocking variant for
    one-shot readers."""

    def __init__(
        self, zctx: zmq.Context[zmq.Socket[bytes]], paths: RunPaths, spec: MapSpec[T],
        on_change: OnChange[T] | None = None, snapshot_timeout: float = 2.0, *,
        clock: Clock, gate: BusGate | None = None,
    ) -> None:
        self.spec = _spec(spec)
        self.map_name = map_name = spec.name
        self._decode = spec.decode
        self.value_drops: Counter[str] = Counter()
        self.epoch: str | None = None
        self.seq = 0
        self.synced = False
        self.resyncs = 0
        self._items: dict[str, T] = {}
        self._buffer: list[MapUpdate] = []
        self._need_sync = True
        self._asked_at: float | None = None
        self._zctx = zctx
        self._paths = paths
        self._on_change = on_change
        self._timeout = snapshot_timeout
        self._clock = clock
        self._sub = Subscriber(zctx, paths, [_topic(map_name)], clock=clock, gate=gate)
        self.socket = self._sub.socket
        self._dealer = self._new_dealer()

    @property
    def sockets(self) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
        return (self._sub.socket, self._dealer)

    @property
    def drops(self) -> Any:
        return self._sub.drops

    @property
    def holding(self) -> bool:
        """Updates a bus fault held back are due (pump even though no socket is readable)."""
        return self._sub.holding

    @property
    def received(self) -> int:
        """Bus messages its subscriber received and decoded (updates, heartbeats)."""
        return self._sub.received

    @property
    def waiting_for_snapshot(self) -> bool:
        """A snapshot request is out and not yet answered."""
        return self._asked_at is not None

    def items(self) -> dict[str, T]:
        return dict(self._items)

    def get(self, key: str) -> T | None:
        return self._items.get(key)

    def pump(self, timeout: float = 0.0) -> None:
        """Handle queued updates and snapshot replies, waiting up to ``timeout`` for the first;
        ask for a snapshot when one is needed and none is outstanding."""
        if timeout > 0:
            poller = zmq.Poller()
            for sock in self.sockets:
                poller.register(sock, zmq.POLLIN)
            poller.poll(int(timeout * 1000))
        env = self._sub.recv(0)
        while env is not None:
            self.handle(env)
            env = self._sub.recv(0)
        self._take_reply()
        if self._need_sync:
            self._ask()

    def handle(self, env: Envelope) -> None:
        msg = env.message
        if isinstance(msg, MapUpdate) and msg.map == self.map_name:
            self._on_update(msg)
        elif (isinstance(msg, MapHeartbeat) and msg.map == self.map_name
              and (msg.epoch != self.epoch or msg.seq > self.seq)):
            self._need_sync = True

    def _on_update(self, msg: MapUpdate) -> None:
        if self._need_sync or msg.epoch != self.epoch or msg.seq > self.seq + 1:
            self._need_sync = True
            if len(self._buffer) < REPLICA_BUFFER:
                self._buffer.append(msg)
            return
        if msg.seq <= self.seq:
            return  # already in the snapshot
        self._apply(msg)

    def _value(self, raw: Any) -> T:
        """The typed value; ``MapValueError`` (counted in ``value_drops``) for a value the spec
        does not read: the caller drops it."""
        try:
            return self._decode(raw)
        except MapValueError as err:
            self.value_drops[err.reason] += 1
            raise

    def _apply(self, msg: MapUpdate) -> None:
        old = self._items.get(msg.key)
        self.seq = msg.seq
        value: T | None = None
        if msg.deleted:
            self._items.pop(msg.key, None)
        else:
            try:
                value = self._items[msg.key] = self._value(msg.value)
            except MapValueError:
                return  # dropped: the key keeps what it had
        if self._on_change is not None and old != value:
            self._on_change(msg.key, old, value)

    def sync(self, timeout: float | None = None) -> bool:
        """Ask for a snapshot and wait for it. False (and still stale) if the owner is silent."""
        deadline = self._clock.monotonic() + (self._timeout if timeout is None else timeout)
        self._asked_at = None
        while True:
            if self._asked_at is None:
                self._ask()
            wait_ms = int((deadline - self._clock.monotonic()) * 1000)
            if wait_ms <= 0:
                return False
            # a poll that times out ends the wait (whatever the injected clock says: a fake
            # one that stands still must not make a blocking call wait forever)
            if self._asked_at is None:  # the send queue was full: wait until it can go out
                if not self._dealer.poll(wait_ms, zmq.POLLOUT):
                    return False
            elif not self._dealer.poll(wait_ms):
                return False
            elif self._take_reply():
                return True

    def _new_dealer(self) -> zmq.Socket[bytes]:
        dealer = self._zctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, SNAPSHOT_MAX_BYTES)
        # No ZMQ_IMMEDIATE: a request asked before the connection completes waits in the pipe
        # (with IMMEDIATE a replica started beside its owner was seen never to get a snapshot).
        # Extra answers a restarted owner gives to queued requests are dropped in _take_reply.
        dealer.connect(self._paths.snapshot(self.map_name))
        return dealer

    def _ask(self) -> None:
        """Send a snapshot request unless one is outstanding and not yet timed out. The DEALER
        stays the same socket for the replica's life (callers register it in their pollers)."""
        now = self._clock.monotonic()
        if self._asked_at is not None and now - self._asked_at < self._timeout:
            return
        try:
            self._dealer.send_multipart([b"", b"SNAPSHOT"], flags=zmq.NOBLOCK)
        except zmq.Again:
            self._asked_at = None  # send queue full: ask again on the next pump
            return
        self._asked_at = now

    def _take_reply(self) -> bool:
        """Read every queued reply. While a snapshot is wanted, the first well-formed answer (to
        this request or to an earlier one that timed out: either was served after we asked) is
        installed; answers arriving when none is wanted are dropped, so a late one can never take
        a synced replica back in time."""
        installed = False
        while True:
            try:
                frames = self._dealer.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return installed
            try:
                snap = msgpack.unpackb(frames[-1], raw=False)
            except (ValueError, msgpack.UnpackException):
                continue
            ok = (isinstance(snap, dict) and snap.get("map") == self.map_name
                  and isinstance(snap.get("seq"), int) and isinstance(snap.get("items"), dict))
            if not ok or self._asked_at is None:
                continue
            self._asked_at = None
            self._install(snap)
            installed = True

    def _install(self, snap: dict[str, Any]) -> None:
        items: dict[str, T] = {}
        for key, raw in snap["items"].items():
            with contextlib.suppress(MapValueError):  # dropped
                items[key] = self._value(raw)
        old, self._items = self._items, items
        self.epoch, self.seq = snap["epoch"], snap["seq"]
        pending, self._buffer = self._buffer, []
        self._need_sync = False
        self.synced = True
        self.resyncs += 1
        self._notify_diff(old)
        for msg in pending:
            if msg.epoch == self.epoch and msg.seq > self.seq:
                self._on_update(msg)

    def _notify_diff(self, old: dict[str, T]) -> None:
        if self._on_change is None:
            return
        for key in old.keys() | self._items.keys():
            if old.get(key) != self._items.get(key):
                self._on_change(key, old.get(key), self._items.get(key))

    def close(self) -> None:
        self._dealer.close(linger=0)
        self._sub.close()
