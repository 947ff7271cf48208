"""The PLEG process: relist the runtime, publish lifecycle events, own the ``pleg`` map.

Two ways to learn of changes (kubelet GenericPLEG and EventedPLEG):

- No event stream (containerd 1.6 answers UNIMPLEMENTED; or the stream is down): a full relist
  every ``RELIST_PERIOD`` (1 s).
- A live GetContainerEvents stream: each event updates its pod's record from the event alone
  (``pod_sandbox_status`` + ``containers_statuses``; ``evented.py``), with no CRI call, and the
  same lifecycle events are derived by diffing. A full relist runs when the stream (re)connects,
  when the watcher dropped events (its queue was full), and every ``STREAM_RELIST_PERIOD``.
  The kubelet's fallback is 300 s (with a 10 min health threshold); ours is 30 s because
  ``/healthz`` keeps the kubelet's 3 min "last relist" threshold (KUBELET.md), which a 30 s
  fallback meets six times over, and because the embedded runtime sends no sandbox events
  (StopPodSandbox / RemovePodSandbox change nothing the stream reports): the fallback bounds how
  long such a change and any missed event stay unseen. Two list calls every 30 s cost next to
  nothing (the relist was every 5 s, and after every event).

- The sync loop's hint (``RelistHint``, topic ``syncloop.relist.hint``): the sync loop publishes
  one when its work has just created, started, stopped or removed containers and the runtime
  has no event stream. Without a stream PLEG then relists at once instead of at its next
  period (a started container seen ~0.1 s after StartContainer on containerd 1.6, not up to 1 s
  later): hints are coalesced (every hint queued when the relist starts is answered by it) and
  bounded (a hinted relist starts no sooner than ``hint_gap`` after the previous relist's
  start: ``HINT_MIN_GAP`` or ``HINT_DUTY`` times that relist's duration, whichever is longer,
  so hinted relists never take more than 1/HINT_DUTY of a core, even in a burst of a thousand
  pods). The periodic relist stays as the safety net: ``RELIST_PERIOD`` after the last relist,
  hinted or not. With a stream the hints are ignored (the sync loop does not send them then).

Cache freshness contract:

- ``_health`` is written after every successful full relist (and only then), after that relist's
  record updates, and carries ``ts`` = SYSTEM_CLOCK.monotonic of the relist's start. Since a map's
  updates are applied in sequence, a replica whose ``_health.ts >= t`` holds every pod record as
  of ``t`` (the kubelet cache's global timestamp). With a live stream ``_health.ts`` advances at
  the relists only (at least every ``STREAM_RELIST_PERIOD``), so ``/healthz`` reads a relist at
  most 30 s old while the runtime answers.
- Records can be newer than ``_health.ts``: a stream event updates its pod's record at once.
  Such a record, and the ``PodLifecycleEvent``s the event produced, carry ``ts`` = the monotonic
  time PLEG took the event off its queue. That is after the runtime made the change, so a
  runtime read started after ``ts`` sees the change (what the sync loop's ``seen_at`` needs); it
  does not promise that the pod's later changes are in (a later event may be in flight), and it
  can be ahead of ``_health.ts``: never wait for ``_health.ts`` to reach an event's ``ts``.
- A relist's records and events carry the relist's ``ts``; pod records change ``ts`` only when
  their content changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

from podvisor.common.buckets import DEF_BUCKETS
from podvisor.common.child import ChildContext
from podvisor.common.logs import EventLog
from podvisor.common.service import ServiceLoop
from podvisor.ipc.bus import Publisher
from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.clone import MapOwner
from podvisor.ipc.maps import HEALTH_KEY, PLEG, PlegHealth, PlegValue
from podvisor.ipc.messages import PodLifecycleEvent, RelistHint
from podvisor.services.cri import CriError, RuntimeClient
from podvisor.services.events import container_died
from podvisor.services.pleg.records import pleg_value
from podvisor.services.pleg.relist import Relister, RelistResult, new_relister
from podvisor.services.pleg.stream import EventWatcher

MAP_NAME = PLEG
RELIST_PERIOD = 1.0
STREAM_RELIST_PERIOD = 30.0
CALL_TIMEOUT = 4.0  # per CRI call; below the default 10 s heartbeat timeout
ERROR_LOG_EVERY = 30.0
# In a burst (200 pods started at once: two events per pod, a few ms apart), after applying
# stream events the wake fd is not polled for this long, so events are applied in batches, not
# one wake-up each. A burst is BURST_EVENTS events applied within BURST_GAP: a lone pod's
# start or restart (create, start; a stop before them: a handful of events) is applied event by
# event, at once, as is any event after a quiet spell.
EVENTS_COALESCE = 0.025
HINT_MIN_GAP = 0.02  # seconds between the starts of two relists, at least, for a hint
HINT_DUTY = 4.0  # ... and at least this many times the previous relist's duration
HINT_TOPIC = RelistHint.TOPIC
BURST_GAP = 2 * EVENTS_COALESCE
BURST_EVENTS = 8

Clock = Callable[[], float]


@dataclass
class Counters:
    relists: int = 0
    relist_errors: int = 0
    stream_events: int = 0  # stream events applied without a relist
    events: int = 0
    event_drops: int = 0


class RelistMetrics:
    """The kubelet's PLEG histograms. In the agent the supervisor turns on prometheus-client's
    multiprocess mode, so the values land in ``<rootDir>/run/metrics`` for the server's
    ``/metrics``; a private registry keeps several loops in one test process apart."""

    def __init__(self) -> None:
        registry = CollectorRegistry(auto_describe=False)
        self.duration = Histogram("kubelet_pleg_relist_duration_seconds",
                                  "Duration in seconds for relisting pods in PLEG",
                                  buckets=DEF_BUCKETS, registry=registry)
        self.interval = Histogram("kubelet_pleg_relist_interval_seconds",
                                  "Interval in seconds between relisting in PLEG",
                                  buckets=DEF_BUCKETS, registry=registry)


class PlegLoop:
    """One relist step and its publishing; the I/O edges are injected (owner, publisher)."""

    def __init__(
        self, relister: Relister, owner: MapOwner[PlegValue], publisher: Publisher,
        log: EventLog,
        clock: Clock = SYSTEM_CLOCK.monotonic, wall: Clock = SYSTEM_CLOCK.wall,
    ) -> None:
        self._relister = relister
        self._owner = owner
        self._pub = publisher
        self._log = log
        self._clock = clock
        self._wall = wall
        self.counters = Counters()
        self.metrics = RelistMetrics()
        self._last_start: float | None = None
        self.last_ok_wall = 0.0
        self._last_error_log = -ERROR_LOG_EVERY
        self._failing = False

    def step(self, events_mode: str, stream_drops: int = 0) -> RelistResult | None:
        """Relist once and publish. Returns None when the runtime could not be listed."""
        start = self._clock()
        if self._last_start is not None:
            self.metrics.interval.observe(max(0.0, start - self._last_start))
        self._last_start = start
        try:
            result = self._relister.relist()
        except CriError as err:
            self._on_error(err)
            return None
        if self._failing:
            self._log.info("pleg.relist_recovered", errors=self.counters.relist_errors)
            self._failing = False
        self.counters.relists += 1
        self.metrics.duration.observe(result.duration)
        self.last_ok_wall = self._wall()
        self._publish(result, self._health(result, events_mode, stream_drops))
        return result

    def apply(self, events: list[Any]) -> RelistResult:
        """Apply stream events (in order) and publish; ``_health`` stays as the last relist
        wrote it (see the module docstring)."""
        result = self._relister.apply_events(events, self._clock())
        self.counters.stream_events += len(events)
        self._publish(result, None)
        return result

    def flush(self) -> RelistResult:
        """Publish the stream updates held for a just-created container, once due."""
        result = self._relister.flush(self._clock())
        self._publish(result, None)
        return result

    def held_until(self) -> float:
        until = self._relister.held_until()
        return math.inf if until is None else until

    def _publish(self, result: RelistResult, health: PlegHealth | None) -> None:
        typed = {uid: pleg_value(record) for uid, record in result.changed.items()}
        for uid, value in typed.items():
            self._owner.set(uid, value)
        for uid in result.removed:
            self._owner.delete(uid)
        if health is not None:
            self._owner.set(HEALTH_KEY, health)
        for ev in result.events:
            msg = PodLifecycleEvent(pod_uid=ev.pod_uid, type=ev.type.value,
                                    container_id=ev.container_id, ts=result.ts)
            self.counters.events += 1
            if not self._pub.publish(msg):
                self.counters.event_drops += 1
            if ev.type.value == "ContainerDied":  # an Event for `podvisorctl events` too
                died = container_died(typed.get(ev.pod_uid), ev.container_id,
                                      ev.pod_uid, "pleg", self._wall())
                if died is not None:
                    self._pub.publish(died)

    def _health(self, result: RelistResult, mode: str, stream_drops: int) -> PlegHealth:
        return PlegHealth(
            ts=result.ts, last_relist_ok=self.last_ok_wall,
            last_relist_ms=round(result.duration * 1000, 3), events_mode=mode,
            relists=self.counters.relists, relist_errors=self.counters.relist_errors,
            stream_events=self.counters.stream_events, event_drops=self.counters.event_drops,
            stream_drops=stream_drops)

    def _on_error(self, err: CriError) -> None:
        self.counters.relist_errors += 1
        now = self._clock()
        if not self._failing or now - self._last_error_log >= ERROR_LOG_EVERY:
            self._log.warning("pleg.relist_failed", error=str(err),
                              errors=self.counters.relist_errors)
            self._last_error_log = now
        self._failing = True


class _Timing:
    """The loop's timers and the event stream's burst accounting (see the module docstring)."""

    def __init__(self, now: float) -> None:
        self.next_relist = now
        self.drops = 0
        self.quiet_until = -math.inf  # the wake fd is not polled before this (EVENTS_COALESCE)
        self.window_at, self.window_events = -math.inf, 0  # events since window_at (BURST_GAP)
        self.polled = True
        self.relist_at, self.relist_took = -math.inf, 0.0  # the last relist's start, duration


def hint_gap(relist_duration: float) -> float:
    """Seconds from a relist's start before a hinted relist may start (the bound)."""
    return max(HINT_MIN_GAP, HINT_DUTY * relist_duration)


def serve(ctx: ChildContext, client: RuntimeClient) -> None:
    """The loop: the snapshot socket and the event stream's wake fd are watched; stream events
    are applied as they come; a relist runs when due (see the module docstring)."""
    clock = ctx.clock.monotonic  # the one clock: the loop, the owner and the relister
    loop = ServiceLoop(ctx)
    pub = loop.publisher()
    owner = loop.owner(pub, MAP_NAME, heartbeat_interval=1.0)
    watcher = EventWatcher(client, ctx.log)
    pleg = PlegLoop(new_relister(client, clock, ctx.heartbeat, ctx.clock.wall_ns), owner, pub,
                    ctx.log, clock, ctx.clock.wall)
    t = _Timing(clock())

    def on_events() -> None:
        events = watcher.drain()
        if (any(e is None for e in events) or watcher.dropped != t.drops
                or not watcher.streaming or t.next_relist <= clock()):
            # a stream (re)connected or went away, events were lost, or a relist is due
            # anyway: relist now; it reads the runtime after these events happened
            t.drops = watcher.dropped
            t.next_relist = clock()
            return
        pleg.apply(events)
        now = clock()
        if now - t.window_at >= BURST_GAP:
            t.window_at, t.window_events = now, 0
        t.window_events += len(events)
        if t.window_events >= BURST_EVENTS:
            t.quiet_until = now + EVENTS_COALESCE

    def step(now: float) -> float:
        """Relist when due, flush held updates; returns the next relist or held update (the
        loop adds the heartbeat and the map's idle heartbeat); events and snapshot requests
        (and stop) end its wait at once."""
        if now >= t.next_relist:
            streaming = watcher.streaming
            t.relist_at = now
            ok = pleg.step("stream" if streaming else "relist", watcher.dropped)
            t.relist_took = clock() - t.relist_at
            period = STREAM_RELIST_PERIOD if streaming and ok is not None else RELIST_PERIOD
            t.next_relist = clock() + period
        if pleg.held_until() <= now:
            pleg.flush()
        now = clock()
        if (now >= t.quiet_until) != t.polled:
            t.polled = not t.polled
            if t.polled:
                loop.watch(watcher.wake_fd, on_events)
            else:
                loop.unwatch(watcher.wake_fd)
        return min(t.next_relist, pleg.held_until(), math.inf if t.polled else t.quiet_until)

    def on_hint() -> None:
        hinted = False
        while hints.recv(0) is not None:  # coalesced: one relist answers them all
            hinted = True
        if hinted and not watcher.streaming:
            t.next_relist = min(t.next_relist, t.relist_at + hint_gap(t.relist_took))

    hints = loop.subscriber([HINT_TOPIC], on_hint)
    loop.watch(watcher.wake_fd, on_events)
    watcher.start()
    try:
        loop.run(step)
    finally:
        watcher.stop()
        loop.close()
        ctx.log.info("pleg.stopped", relists=pleg.counters.relists,
                     events=pleg.counters.events, event_drops=pleg.counters.event_drops,
                     stream_events=pleg.counters.stream_events)
