"""The one service loop: what every subsystem process's main loop is made of.

A subsystem declares what it consumes and owns, then hands the loop its ``step``::

    loop = ServiceLoop(ctx)
    pub = loop.publisher()
    owner = loop.owner(pub, STATUSES)                   # served and ticked by the loop
    desired = loop.replica(DESIRED, on_change)           # pumped by the loop
    loop.watch(some_fd, handler)                          # any other socket or fd
    loop.run(step)                                        # step(now) -> next deadline or None

``ServiceLoop`` owns the process's one ``zmq.Poller`` (the only one a service loop constructs),
the stop fd (registered, so a stop ends any wait at once), the heartbeat (at least once per
``heartbeatInterval``), the declared replicas (pumped when their sockets are readable and while
they are not synced), the map owners (snapshot requests served when asked, idle heartbeats sent
on time), the timers (``step`` returns the monotonic time it next needs a turn) and the injected
clock (``ctx.clock``: a test drives the whole loop with a ``FakeClock``).

One turn: heartbeat, ``step(now)``, the owners' ticks, then one poll until the nearest deadline
(``step``'s, an owner's idle heartbeat, the next heartbeat, a replica still fetching its
snapshot); then the ready handlers run, the owners serve and the replicas pump. ``hold(until)``
leaves the replicas' traffic queued in ZeroMQ until ``until`` (a service that cannot use new
input yet, e.g. inside a coalescing window, is not woken by it).

The bus counters (``common/busmetrics.py``): every publisher, subscriber and replica declared
here is tallied in ``bus``; each turn ends with ``flush_bus()`` (at most once a second, and once
more at ``close()``), which adds what they counted to the process's
``podvisor_bus_messages_total`` / ``podvisor_bus_dropped_total{reason}``. A publisher or
subscriber made outside the loop can be added with ``bus.publishing``/``bus.receiving``.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import zmq

from podvisor.common.busmetrics import FLUSH_EVERY, BusTally
from podvisor.common.child import ChildContext
from podvisor.ipc.bus import Publisher, Subscriber
from podvisor.ipc.clone import MapOwner, MapReplica, OnChange
from podvisor.ipc.maps import MapSpec

__all__ = ["ServiceLoop", "Step", "WakePipe"]

T = TypeVar("T")
Step = Callable[[float], float | None]
REPLICA_RETRY = 0.5  # a replica without its snapshot is pumped again at least this often


class _Closable(Protocol):
    def close(self) -> None: ...


class WakePipe:
    """A non-blocking pipe another thread writes to wake the loop (``wake()``); the loop polls
    ``read_fd`` and ``drain()``s it."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        for fd in (self.read_fd, self.write_fd):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # full pipe: already awake; closed: stopping
            os.write(self.write_fd, b"x")

    def drain(self) -> None:
        with contextlib.suppress(OSError):  # empty (BlockingIOError) or closed
            while os.read(self.read_fd, 4096):
                pass

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)


class ServiceLoop:
    """One process's event loop (main thread only). See the module docstring."""

    def __init__(self, ctx: ChildContext) -> None:
        self.ctx = ctx
        self.clock = ctx.clock
        self.poller = zmq.Poller()
        self.ready: dict[Any, int] = {}  # what the last poll found readable
        self._handlers: dict[Any, Callable[[], object]] = {}
        self._replicas: list[MapReplica[Any]] = []
        self._replica_socks: list[Any] = []
        self._owners: list[MapOwner[Any]] = []
        self._serving: dict[MapOwner[Any], bool] = {}
        self._closables: list[_Closable] = []
        self._alive: list[Callable[[float], bool]] = []
        self._held_until = -math.inf
        self._holding = False
        self.last_pump = -math.inf  # when a poll last pumped a replica (monotonic)
        # blocked in a poll that watches every replica, all synced: whatever was published
        # before it holds every update queued so far (read from any thread, e.g. a web thread
        # deciding whether a fresh view needs a drain)
        self.idle = False
        self.bus = BusTally()  # podvisor_bus_* counters of what this loop declares
        self._bus_flushed = -math.inf
        self._stop_watched = ctx.stop_fd is not None
        if ctx.stop_fd is not None:
            self.poller.register(ctx.stop_fd, zmq.POLLIN)

    # --- declarations -------------------------------------------------------------------------
    def publisher(self) -> Publisher:
        pub = Publisher(self.ctx.zctx, self.ctx.paths, self.ctx.name, clock=self.clock)
        self._closables.append(pub)
        self.bus.publishing(pub)
        return pub

    def subscriber(self, topics: list[str] | tuple[str, ...],
                   handler: Callable[[], object] | None = None) -> Subscriber:
        sub = Subscriber(self.ctx.zctx, self.ctx.paths, topics, clock=self.clock)
        self.watch(sub.socket, handler)
        self._closables.append(sub)
        self.bus.receiving(sub)
        return sub

    def owner(self, publisher: Publisher, spec: MapSpec[T], *, serving: bool = True,
              heartbeat_interval: float | None = None) -> MapOwner[T]:
        """The map this process owns (``spec``: its declaration in ``ipc/maps.py``).
        ``serving=False``: snapshot requests wait (queued) until ``serve(owner)`` (an owner
        whose map is not complete yet)."""
        interval = self.ctx.heartbeat_interval if heartbeat_interval is None else heartbeat_interval
        owner = MapOwner(self.ctx.zctx, self.ctx.paths, publisher, spec,
                         heartbeat_interval=interval, clock=self.clock)
        self._owners.append(owner)
        self._serving[owner] = False
        self._closables.append(owner)
        if serving:
            self.serve(owner)
        return owner

    def serving(self, owner: MapOwner[Any]) -> bool:
        return self._serving[owner]

    def serve(self, owner: MapOwner[Any]) -> None:
        if not self._serving[owner]:
            self._serving[owner] = True
            self.poller.register(owner.socket, zmq.POLLIN)

    def replica(self, spec: MapSpec[T], on_change: OnChange[T] | None = None, *,
                snapshot_timeout: float = 2.0) -> MapReplica[T]:
        """A map this process consumes (``spec``: its declaration in ``ipc/maps.py``; its
        values are read as the spec's type), pumped by the loop: both its sockets are watched
        (updates, snapshot answers)."""
        replica = MapReplica(self.ctx.zctx, self.ctx.paths, spec, on_change,
                             snapshot_timeout, clock=self.clock)
        for sock in replica.sockets:
            self.poller.register(sock, zmq.POLLIN)
        self._replica_socks.extend(replica.sockets)
        self._replicas.append(replica)
        self._closables.append(replica)
        self.bus.receiving(replica)
        self.bus.decoding(replica)
        return replica

    def watch(self, item: Any, handler: Callable[[], object] | None = None) -> None:
        """Poll ``item`` (a zmq socket or an fd); ``handler`` runs when it is readable."""
        self.poller.register(item, zmq.POLLIN)
        if handler is not None:
            self._handlers[item] = handler

    def unwatch(self, item: Any) -> None:
        self.poller.unregister(item)
        self._handlers.pop(item, None)

    def beat_while(self, alive: Callable[[float], bool]) -> None:
        """Heartbeat only while ``alive(now)`` holds (another thread of the process that must
        stay responsive, e.g. a web thread's event loop: silent, the supervisor restarts the
        process as hung)."""
        self._alive.append(alive)

    def closing(self, closable: _Closable) -> None:
        """Close ``closable`` with the loop (in reverse order of declaration)."""
        self._closables.append(closable)

    # --- running ------------------------------------------------------------------------------
    def hold(self, until: float) -> None:
        """Leave the replicas' traffic queued until ``until`` (monotonic)."""
        self._held_until = until

    @property
    def holding(self) -> bool:
        """The last poll left the replicas' traffic queued (see ``hold``)."""
        return self._holding

    def synced(self) -> bool:
        return all(r.synced for r in self._replicas)

    def next_deadline(self, now: float, wanted: float | None) -> float:
        """The nearest of: ``wanted``, the next heartbeat, an owner's idle heartbeat, a replica
        still fetching its snapshot."""
        deadlines = [now + self.ctx.heartbeat_interval]
        if wanted is not None:
            deadlines.append(wanted)
        deadlines.extend(owner.next_tick() for owner in self._owners)
        if not self.synced():
            deadlines.append(now + REPLICA_RETRY)
        return min(deadlines)

    def _set_holding(self, holding: bool) -> None:
        if holding == self._holding:
            return
        self._holding = holding
        for sock in self._replica_socks:
            if holding:
                self.poller.unregister(sock)
            else:
                self.poller.register(sock, zmq.POLLIN)

    def poll(self, timeout: float) -> dict[Any, int]:
        """One wait of at most ``timeout`` seconds, then every ready handler, the owners'
        snapshot answers and the replicas' pumps. Returns what was readable."""
        now = self.clock.monotonic()
        self._set_holding(now < self._held_until and self.synced())
        if self._holding:
            timeout = min(timeout, max(0.0, self._held_until - now))
        self.idle = not self._holding and self.synced()
        try:
            self.ready = dict(self.poller.poll(math.ceil(max(0.0, timeout) * 1000)))
        finally:
            self.idle = False
        for item, handler in list(self._handlers.items()):
            if item in self.ready:
                handler()
        for owner in self._owners:
            if self._serving[owner] and owner.socket in self.ready:
                owner.serve()
        if not self._holding:
            for replica in self._replicas:
                if not replica.synced or any(s in self.ready for s in replica.sockets):
                    replica.pump(0)
                    self.last_pump = self.clock.monotonic()
        return self.ready

    def tick(self) -> None:
        """The owners' idle heartbeats, when due."""
        now = self.clock.monotonic()
        for owner in self._owners:
            owner.tick(now)

    def turn(self, step: Step) -> None:
        """One turn: heartbeat, ``step(now)``, ticks, one poll until the nearest deadline."""
        now = self.clock.monotonic()
        if all(alive(now) for alive in self._alive):
            self.ctx.heartbeat()
        wanted = step(now)
        self.tick()
        now = self.clock.monotonic()
        self.poll(self.next_deadline(now, wanted) - now)
        self.flush_bus()

    def flush_bus(self, force: bool = False) -> None:
        """Add what the bus endpoints counted to the process's ``podvisor_bus_*`` counters (at
        most once per ``FLUSH_EVERY`` unless ``force``)."""
        now = self.clock.monotonic()
        if force or now - self._bus_flushed >= FLUSH_EVERY:
            self._bus_flushed = now
            self.bus.flush()

    def run(self, step: Step, done: Callable[[], bool] | None = None) -> None:
        """Turn until ``done()`` (default: until ``ctx.stop`` is set)."""
        finished = self.ctx.stop.is_set if done is None else done
        while not finished():
            self.turn(step)

    def ignore_stop(self) -> None:
        """Stop watching the stop fd (a service that goes on working after a stop, e.g. to stop
        its pods, would otherwise find it readable on every poll)."""
        if self.ctx.stop_fd is not None and self._stop_watched:
            self._stop_watched = False
            self.poller.unregister(self.ctx.stop_fd)

    def close(self) -> None:
        self.flush_bus(force=True)
        for closable in reversed(self._closables):
            closable.close()
        self._closables.clear()
