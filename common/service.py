"""The one service loop: what every subsystem process's main loop is made of.

A subsystem declares what it consumes and owns, then hands the loop its ``step``::

    loop = ServiceLoop(ctx)
    pub = loop.publisher()
    owner = loop.owner(pub, STATUSES)                   # served and ticked by the loop
    desired = loop.replica(DESIRED, on_change)           # pumped by the loop
    loop.watch(some_fd, handler)                          # any other socket or fd
    api = loop.worker(writer.step, stall=120.0, name="writer")  # a helper thread, see Worker
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

Work that blocks (an HTTP request to the API server, parsing a big manifest, RunOnce's whole
run) goes to a ``Worker`` the loop owns (``loop.worker(step, stall=...)``): its thread runs
``step(now)`` on the same clock, and the loop starts it, hands what it ``put``s to
``deliver`` on the loop's thread, raises its failure (or ``WorkerStalled``) there, so the process
exits and the supervisor restarts it, and stops it at ``close()``. No service writes a loop of
its own (tests/shape/test_loops_shape.py counts them).

The bus counters (``common/busmetrics.py``): every publisher, subscriber and replica declared
here is tallied in ``bus``; each turn ends with ``flush_bus()`` (at most once a second, and once
more at ``close()``), which adds what they counted to the process's
``podvisor_bus_messages_total`` / ``podvisor_bus_dropped_total{reason}``. A publisher or
subscriber made outside the loop can be added with ``bus.publishing``/``bus.receiving``.

Injected faults (issue 28): the loop reads the faults aimed at its process (``FaultWatch``, an
inotify fd it polls) and applies the ``bus`` ones itself: every publisher, subscriber and replica
declared here consults its ``gate`` (``ipc/busgate.py``: drop, delay, duplicate), the loop sends
held frames when due and hands held messages over. Other seams take theirs with
``on_faults(callback)`` (the embedded runtime's servicer: ``cri``). The process logs
``faults.in_force`` (the ids) once every seam has them: the control request that injected or
cleared a fault answers before that (tests/support/faultpods.py ``wait_in_force``).
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import zmq

from podvisor.common.busmetrics import FLUSH_EVERY, BusTally
from podvisor.common.child import ChildContext
from podvisor.common.faultwatch import FaultWatch
from podvisor.ipc.bus import Publisher, Subscriber
from podvisor.ipc.busgate import BusGate
from podvisor.ipc.clock import Clock
from podvisor.ipc.clone import MapOwner, MapReplica, OnChange
from podvisor.ipc.faults import ActiveFault
from podvisor.ipc.maps import MapSpec

__all__ = ["ServiceLoop", "Step", "WakePipe", "Worker", "WorkerStalled"]

T = TypeVar("T")
Step = Callable[[float], float | None]
REPLICA_RETRY = 0.5  # a replica without its snapshot is pumped again at least this often
WORKER_JOIN = 2.0  # close() waits this long for a worker's step in flight to end


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


class WorkerStalled(RuntimeError):
    """A worker's step ran longer than its ``stall`` without a ``tick``."""


class Worker(Generic[T]):
    """A helper thread of a ``ServiceLoop`` (made by ``loop.worker``): it runs ``step(now)``,
    then again when the monotonic time ``step`` returned comes (None: only once woken), on the
    loop's clock, until the loop closes. The first step runs at the loop's first turn.

    Thread-safety: ``step``, ``tick`` and ``put`` belong to the worker's thread, ``wake`` to any
    thread, the rest to the loop's. What ``step`` raises ends the worker and is raised on the
    loop's thread; so is ``WorkerStalled`` once one step has run ``stall`` seconds (None: no
    limit) without a ``tick()``; either ends ``loop.run``, so the process exits and the
    supervisor restarts it (a hung subsystem counts as a dead one). Time spent waiting between
    steps is not a stall. ``put(item)`` hands ``item`` to ``deliver`` on the loop's thread, in
    order, before a later failure is raised. A test on a ``FakeClock`` that advances the clock
    past a step's time calls ``wake()`` (the thread waits for real seconds of the fake clock's).
    """

    def __init__(self, step: Step, *, clock: Clock, stall: float | None, name: str,
                 deliver: Callable[[T], object] | None = None,
                 join_timeout: float = WORKER_JOIN) -> None:
        self.name = name
        self._step = step
        self._clock = clock
        self._stall = stall
        self._deliver = deliver
        self._join_timeout = join_timeout
        self._results: queue.SimpleQueue[T] = queue.SimpleQueue()
        self._failure: BaseException | None = None
        self._busy_since: float | None = None  # when the step in flight began (or ticked)
        self._stopping = False
        self._woken = threading.Event()
        self._pipe = WakePipe()  # wakes the loop: results, or the failure
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def wake_fd(self) -> int:
        """Readable when results or a failure wait for the loop (the loop watches it)."""
        return self._pipe.read_fd

    # --- the worker's thread ------------------------------------------------------------------
    def _run(self) -> None:
        due: float | None = -math.inf
        try:
            while not self._stopping:
                now = self._clock.monotonic()
                if not self._woken.is_set() and (due is None or now < due):
                    self._woken.wait(None if due is None
                                     else min(due - now, threading.TIMEOUT_MAX))
                    continue  # look again: stopped, woken, or due
                self._woken.clear()  # a wake() from now on runs another step
                self._busy_since = now
                try:
                    due = self._step(now)
                finally:
                    self._busy_since = None
        except BaseException as exc:  # raised on the loop's thread (check)
            self._failure = exc
            self._pipe.wake()

    def tick(self) -> None:
        """The step in flight is still making progress (a long step: resets the stall)."""
        if self._busy_since is not None:
            self._busy_since = self._clock.monotonic()

    def put(self, item: T) -> None:
        """Hand ``item`` to ``deliver`` on the loop's thread."""
        self._results.put(item)
        self._pipe.wake()

    # --- any thread ---------------------------------------------------------------------------
    def wake(self) -> None:
        """Run the next step now (new input for it, or a clock moved on)."""
        self._woken.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # --- the loop's thread --------------------------------------------------------------------
    def start(self) -> None:
        if self._thread.ident is None:
            self._thread.start()

    def take(self) -> None:
        """Deliver what the worker put, then raise its failure, if any."""
        self._pipe.drain()
        self._deliver_all()
        self.check(self._clock.monotonic())

    def _deliver_all(self) -> None:
        while True:
            try:
                item = self._results.get_nowait()
            except queue.Empty:
                return
            if self._deliver is not None:
                self._deliver(item)

    def check(self, now: float) -> None:
        """Raise the worker's failure (after delivering what it put before), or
        ``WorkerStalled``."""
        if self._failure is not None:
            self._deliver_all()
            raise self._failure
        since = self._busy_since
        if self._stall is not None and since is not None and now - since > self._stall:
            raise WorkerStalled(f"{self.name}: a step made no progress for {now - since:.0f} s")

    def stop(self) -> None:
        """End the worker after its step in flight (waited for up to ``join_timeout``; a daemon
        thread still blocked in it is left, with its wake pipe)."""
        self._stopping = True
        self._woken.set()
        if self._thread.ident is not None:
            self._thread.join(self._join_timeout)
        if not self._thread.is_alive():
            with contextlib.suppress(OSError):
                self._pipe.close()


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
        self._workers: list[Worker[Any]] = []
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
        self._subs: dict[Any, Subscriber] = {}  # socket -> subscriber (held messages)
        self.gate = BusGate(self.clock)
        self._fault_listeners: list[Callable[[tuple[ActiveFault, ...]], object]] = []
        self._faults_said = False  # a faults.in_force line named a fault: say when none is left
        self.fault_watch = FaultWatch(ctx.paths, ctx.name)
        self._closables.append(self.fault_watch)
        if self.fault_watch.fd is not None:
            self.watch(self.fault_watch.fd, self._faults_changed)
        self._apply_faults()

    # --- injected faults ----------------------------------------------------------------------
    @property
    def faults(self) -> tuple[ActiveFault, ...]:
        """The faults in force aimed at this process."""
        return self.fault_watch.current

    def on_faults(self, callback: Callable[[tuple[ActiveFault, ...]], object]) -> None:
        """Call ``callback(faults)`` now and whenever the faults aimed at this process change."""
        self._fault_listeners.append(callback)
        callback(self.faults)

    def _faults_changed(self) -> None:
        if self.fault_watch.changed():
            self._apply_faults()

    def _apply_faults(self) -> None:
        """Hand the faults to every seam, then log ``faults.in_force``: the line says they
        are applied (the supervisor's ``fault-inject`` answers once the file is written, before
        this process read it; tests wait for the line)."""
        faults = self.faults
        self.gate.set_rules([f.spec for f in faults])
        for callback in self._fault_listeners:
            callback(faults)
        if faults or self._fault_listeners or self._faults_said:
            self.ctx.log.info("faults.in_force", faults=[f.id for f in faults],
                              what=[f.spec.describe() for f in faults])
            self._faults_said = bool(faults)

    # --- declarations -------------------------------------------------------------------------
    def publisher(self) -> Publisher:
        pub = Publisher(self.ctx.zctx, self.ctx.paths, self.ctx.name, clock=self.clock,
                        gate=self.gate)
        self._closables.append(pub)
        self.bus.publishing(pub)
        return pub

    def subscriber(self, topics: list[str] | tuple[str, ...],
                   handler: Callable[[], object] | None = None) -> Subscriber:
        sub = Subscriber(self.ctx.zctx, self.ctx.paths, topics, clock=self.clock,
                         gate=self.gate)
        self.watch(sub.socket, handler)
        self._subs[sub.socket] = sub
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
                             snapshot_timeout, clock=self.clock, gate=self.gate)
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
        self._subs.pop(item, None)

    def worker(self, step: Step, *, stall: float | None, name: str,
               deliver: Callable[[T], object] | None = None,
               join_timeout: float = WORKER_JOIN) -> Worker[T]:
        """A helper thread running ``step(now)`` (see ``Worker``), started at the first turn,
        checked every turn, stopped at ``close()`` before anything declared here closes."""
        worker: Worker[T] = Worker(step, clock=self.clock, stall=stall, name=name,
                                   deliver=deliver, join_timeout=join_timeout)
        self.watch(worker.wake_fd, worker.take)
        self._workers.append(worker)
        return worker

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
        held = self.gate.next_due()
        if held is not None:
            deadlines.append(held)
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
            if item in self.ready or ((sub := self._subs.get(item)) is not None and sub.holding):
                handler()
        for owner in self._owners:
            if self._serving[owner] and owner.socket in self.ready:
                owner.serve()
        if not self._holding:
            for replica in self._replicas:
                if not replica.synced or replica.holding or any(
                        s in self.ready for s in replica.sockets):
                    replica.pump(0)
                    self.last_pump = self.clock.monotonic()
        return self.ready

    def tick(self) -> None:
        """The owners' idle heartbeats, when due."""
        now = self.clock.monotonic()
        for owner in self._owners:
            owner.tick(now)

    def turn(self, step: Step) -> None:
        """One turn: the workers' checks, heartbeat, ``step(now)``, ticks, one poll until the
        nearest deadline."""
        now = self.clock.monotonic()
        for worker in self._workers:
            worker.start()
            worker.check(now)
        if all(alive(now) for alive in self._alive):
            self.ctx.heartbeat()
        wanted = step(now)
        self.tick()
        now = self.clock.monotonic()
        self.gate.release(now)
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
        for worker in self._workers:
            if worker.wake_fd in self._handlers:
                self.unwatch(worker.wake_fd)
            worker.stop()
        self._workers.clear()
        self.flush_bus(force=True)
        for closable in reversed(self._closables):
            closable.close()
        self._closables.clear()
