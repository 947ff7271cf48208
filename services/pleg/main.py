"""The PLEG process: relist the runtime, publish lifecycle events, own the ``pleg`` map.

Periods: 1 s relists when there is no event stream (kubelet GenericPLEG); with a live
GetContainerEvents stream every event wakes the loop for an immediate relist, and a slower
fallback relist runs every 5 s (``STREAM_RELIST_PERIOD``) to catch anything a stream could miss.

Cache freshness contract: the ``_health`` entry is written after every successful relist, after
that relist's record updates, and carries ``ts`` (time.monotonic of the relist's start). Since a
map's updates are applied in sequence, a replica whose ``_health.ts >= t`` holds every pod
record as of ``t`` (the kubelet cache's global timestamp). A ``PodLifecycleEvent`` carries the
same ``ts`` as the relist that produced it; pod records carry the ``ts`` of the relist that last
changed them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from podvisor.ipc.bus import Publisher
from podvisor.ipc.clone import MapOwner
from podvisor.ipc.messages import PodLifecycleEvent
from podvisor.services.cri import CriError, RuntimeClient, new_runtime_client
from podvisor.services.events.model import container_died
from podvisor.services.pleg.relist import Relister, RelistResult, new_relister
from podvisor.services.pleg.stream import EventWatcher
from podvisor.supervisor.child import ChildContext
from podvisor.supervisor.logs import EventLog

MAP_NAME = "pleg"
HEALTH_KEY = "_health"
RELIST_PERIOD = 1.0
STREAM_RELIST_PERIOD = 5.0
CALL_TIMEOUT = 4.0  # per CRI call; below the default 10 s heartbeat timeout
ERROR_LOG_EVERY = 30.0

Clock = Callable[[], float]


def cri_endpoint(runtime_endpoint: str, cri_socket: str) -> str:
    """``embedded`` means the embedded runtime's socket under ``run/``."""
    return f"unix://{cri_socket}" if runtime_endpoint == "embedded" else runtime_endpoint


@dataclass
class Counters:
    relists: int = 0
    relist_errors: int = 0
    events: int = 0
    event_drops: int = 0


class PlegLoop:
    """One relist step and its publishing; the I/O edges are injected (owner, publisher)."""

    def __init__(
        self, relister: Relister, owner: MapOwner, publisher: Publisher, log: EventLog,
        clock: Clock = time.monotonic, wall: Clock = time.time,
    ) -> None:
        self._relister = relister
        self._owner = owner
        self._pub = publisher
        self._log = log
        self._clock = clock
        self._wall = wall
        self.counters = Counters()
        self.last_ok_wall = 0.0
        self._last_error_log = -ERROR_LOG_EVERY
        self._failing = False

    def step(self, events_mode: str, stream_drops: int = 0) -> RelistResult | None:
        """Relist once and publish. Returns None when the runtime could not be listed."""
        try:
            result = self._relister.relist()
        except CriError as err:
            self._on_error(err)
            return None
        if self._failing:
            self._log.info("pleg.relist_recovered", errors=self.counters.relist_errors)
            self._failing = False
        self.counters.relists += 1
        self.last_ok_wall = self._wall()
        for uid, record in result.changed.items():
            self._owner.set(uid, record)
        for uid in result.removed:
            self._owner.delete(uid)
        self._owner.set(HEALTH_KEY, self._health(result, events_mode, stream_drops))
        for ev in result.events:
            msg = PodLifecycleEvent(pod_uid=ev.pod_uid, type=ev.type.value,
                                    container_id=ev.container_id, ts=result.ts)
            self.counters.events += 1
            if not self._pub.publish(msg):
                self.counters.event_drops += 1
            if ev.type.value == "ContainerDied":  # an Event for `podvisorctl events` too
                died = container_died(result.changed.get(ev.pod_uid), ev.container_id,
                                      ev.pod_uid, "pleg", self._wall())
                if died is not None:
                    self._pub.publish(died)
        return result

    def _health(self, result: RelistResult, mode: str, stream_drops: int) -> dict[str, Any]:
        return {
            "last_relist_ok": self.last_ok_wall,
            "last_relist_ms": round(result.duration * 1000, 3),
            "events_mode": mode,
            "ts": result.ts,
            "relists": self.counters.relists,
            "relist_errors": self.counters.relist_errors,
            "event_drops": self.counters.event_drops,
            "stream_drops": stream_drops,
        }

    def _on_error(self, err: CriError) -> None:
        self.counters.relist_errors += 1
        now = self._clock()
        if not self._failing or now - self._last_error_log >= ERROR_LOG_EVERY:
            self._log.warning("pleg.relist_failed", error=str(err),
                              errors=self.counters.relist_errors)
            self._last_error_log = now
        self._failing = True


def _new_client(ctx: ChildContext) -> RuntimeClient:
    cfg = ctx.config
    timeout = min(cfg.runtime_request_timeout, CALL_TIMEOUT)
    return new_runtime_client(cri_endpoint(cfg.runtime_endpoint, str(ctx.paths.cri_socket)),
                              timeout=timeout)


def serve(ctx: ChildContext, client: RuntimeClient, clock: Clock = time.monotonic) -> None:
    """The loop: poll the snapshot socket and the event stream's wake fd; relist when due."""
    pub = Publisher(ctx.zctx, ctx.paths, ctx.name)
    owner = MapOwner(ctx.zctx, ctx.paths, pub, MAP_NAME)
    watcher = EventWatcher(client, ctx.log)
    loop = PlegLoop(new_relister(client, clock, ctx.heartbeat), owner, pub, ctx.log, clock)
    poller = zmq.Poller()
    poller.register(owner.socket, zmq.POLLIN)
    poller.register(watcher.wake_fd, zmq.POLLIN)
    if ctx.stop_fd is not None:
        poller.register(ctx.stop_fd, zmq.POLLIN)
    watcher.start()
    next_relist = clock()
    try:
        while not ctx.stop.is_set():
            ctx.heartbeat()
            now = clock()
            if now >= next_relist:
                mode = "stream" if watcher.streaming else "relist"
                loop.step(mode, watcher.dropped)
                period = STREAM_RELIST_PERIOD if watcher.streaming else RELIST_PERIOD
                next_relist = clock() + period
            owner.tick(clock())
            # block until the next relist, heartbeat or map heartbeat; events and snapshot
            # requests (and stop) wake the poll at once
            now = clock()
            wait = max(0.0, min(next_relist, owner.next_tick(), now + ctx.heartbeat_interval)
                       - now)
            ready = dict(poller.poll(math.ceil(wait * 1000)))
            if owner.socket in ready:
                owner.serve()
            if watcher.wake_fd in ready:
                watcher.drain()
                next_relist = clock()  # an event (or a stream mode change): relist now
    finally:
        watcher.stop()
        owner.close()
        pub.close()
        ctx.log.info("pleg.stopped", relists=loop.counters.relists,
                     events=loop.counters.events, event_drops=loop.counters.event_drops)


def run(ctx: ChildContext) -> None:
    client = _new_client(ctx)
    try:
        serve(ctx, client)
    finally:
        client.close()
