"""Replicas for the HTTP server, pumped on one thread (zmq sockets are thread-bound).

``ReplicaPump`` owns the ``desired``, ``statuses`` and ``pleg`` replicas; traffic on the
``desired`` replica's subscriber (the owner's updates and idle heartbeats) tells when the sync
loop was last heard. A drain applies every queued update and publishes a new immutable ``View``
by swapping one attribute (atomic under the GIL); aiohttp handlers read ``pump.view`` and never
touch zmq. A map is copied into the view only when it moved.

Lazy: the view is what HTTP clients read, so the pump does not drain on every update. Traffic
waits (queued in zmq) until ``BATCH`` after the previous drain, unless a handler asks for a
fresh view (``await pump.refresh()``: the pump drains at once and hands back the view). 200
pods starting send ~1000 updates in 2 s: drained per request (a poller every 0.1 s) or per
``BATCH``, not one wake-up, drain and view per update. While a replica waits for its snapshot
the pump drains at once. The sync loop's "heard" time is that of the drain that found its
traffic (at most ``BATCH`` late; the health threshold is 30 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import zmq

from podvisor.common.child import StopEvent
from podvisor.ipc.clock import SYSTEM_CLOCK, Clock
from podvisor.ipc.clone import MapReplica
from podvisor.ipc.maps import DESIRED, PLEG, STATUSES
from podvisor.ipc.paths import RunPaths

SNAPSHOT_TIMEOUT = 0.5
BATCH = 0.5  # traffic waits at most this long for a drain when no handler asks for one
REFRESH_TIMEOUT = 2.0  # a handler waits at most this long for a drain (then: the last view)
_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class View:
    """What the handlers see. Never mutated after publication."""

    desired: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    statuses: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    pleg: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    desired_synced: bool = False
    statuses_synced: bool = False
    pleg_synced: bool = False
    desired_heard: float | None = None  # monotonic time the desired owner was last heard


class ReplicaPump:
    def __init__(self, zctx: zmq.Context[zmq.Socket[bytes]], paths: RunPaths,
                 clock: Clock = SYSTEM_CLOCK, batch: float = BATCH) -> None:
        self._zctx = zctx
        self._paths = paths
        self._clock = clock.monotonic
        self._clocks = clock  # the one clock, handed to the replicas
        self._batch = batch
        self.view = View()
        self.stop = StopEvent()  # pollable: close() wakes the pump thread at once
        self.error: BaseException | None = None
        self.pumps = 0  # drains
        self._keys: dict[str, tuple[Any, ...]] = {}
        self._heard: float | None = None
        self._quiet = False  # the pump waits for traffic with none queued (its view is fresh)
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[View]]] = []
        self._ask_r, self._ask_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="replica-pump", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    async def refresh(self, timeout: float = REFRESH_TIMEOUT) -> View:
        """A view holding every update queued when this was called (on the event loop): the
        current one when the pump waits with nothing queued, else the one of a drain the pump
        makes at once."""
        if self._quiet or not self.alive() or self._ask_w < 0:
            return self.view  # nothing queued (or nobody to drain it): no round trip
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[View] = loop.create_future()
        with self._lock:
            self._waiters.append((loop, fut))
        with contextlib.suppress(OSError):  # full: the pump is woken already
            os.write(self._ask_w, b"x")
        late = loop.call_later(timeout, lambda: _resolve(fut, self.view))
        try:
            return await fut
        finally:
            late.cancel()

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as err:  # reported to the main thread, which exits
            self.error = err
        finally:
            self._answer()

    def _loop(self) -> None:
        maps = {name: MapReplica(self._zctx, self._paths, name, snapshot_timeout=SNAPSHOT_TIMEOUT,
                                 clock=self._clocks)
                for name in (DESIRED, STATUSES, PLEG)}
        owner = maps[DESIRED].socket  # the desired owner's updates and idle heartbeats
        heard: float | None = None
        # for the thread's life (a replica keeps its sockets for life): traffic or a request,
        # then (holding traffic for the batch) only a request or stop
        poller, asked = zmq.Poller(), zmq.Poller()
        for sock in [s for r in maps.values() for s in r.sockets]:
            poller.register(sock, zmq.POLLIN)
        for fd in (self.stop.fileno(), self._ask_r):
            poller.register(fd, zmq.POLLIN)
            asked.register(fd, zmq.POLLIN)
        last = -math.inf
        try:
            while not self.stop.is_set():
                # block until traffic (every owner heartbeats); re-ask a snapshot that is still
                # missing every SNAPSHOT_TIMEOUT
                synced = all(r.synced for r in maps.values())
                self._quiet = synced  # blocked with nothing queued: the view is fresh
                try:
                    ready = dict(poller.poll(None if synced else int(SNAPSHOT_TIMEOUT * 1000)))
                finally:
                    self._quiet = False
                hold = last + self._batch - self._clock()
                if synced and self._ask_r not in ready and hold > 0:
                    ready = dict(asked.poll(math.ceil(hold * 1000)))
                if self._ask_r in ready:
                    with contextlib.suppress(OSError):
                        os.read(self._ask_r, 4096)
                last = self._clock()
                ready = dict(poller.poll(0))  # what is queued now (held traffic included)
                if owner in ready:
                    heard = last
                for replica in maps.values():
                    if any(s in ready for s in replica.sockets) or not replica.synced:
                        replica.pump(0)
                self._publish(maps, heard)
                self._answer()
        finally:
            for replica in maps.values():
                replica.close()

    def _answer(self) -> None:
        """Hand the current view to the handlers waiting for a drain."""
        with self._lock:
            waiters, self._waiters = self._waiters, []
        view = self.view
        for loop, fut in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, fut, view)

    def _publish(self, maps: Mapping[str, MapReplica], heard: float | None) -> None:
        self.pumps += 1
        keys = {name: (r.epoch, r.seq, r.synced) for name, r in maps.items()}
        if keys == self._keys and heard == self._heard:
            return  # nothing moved: keep the current view
        old = self.view
        fresh = {name: MappingProxyType(maps[name].items()) for name in keys
                 if keys[name] != self._keys.get(name)}
        self._keys, self._heard = keys, heard
        d, s, p = maps[DESIRED], maps[STATUSES], maps[PLEG]
        self.view = View(fresh.get(DESIRED, old.desired), fresh.get(STATUSES, old.statuses),
                         fresh.get(PLEG, old.pleg), d.synced, s.synced, p.synced, heard)

    def close(self, timeout: float = 2.0) -> None:
        self.stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if not self._thread.is_alive() and self._ask_w >= 0:
            fds, self._ask_r, self._ask_w = (self._ask_r, self._ask_w), -1, -1
            for fd in fds:
                os.close(fd)


def _resolve(fut: asyncio.Future[View], view: View) -> None:
    if not fut.done():
        fut.set_result(view)
