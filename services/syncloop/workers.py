"""The pod worker table: one worker per pod UID, driven by one thread (the sync loop's).

A single-threaded scheduler over a table, not a thread per pod: the loop thread owns every
worker's state and hands each due piece of work (a sync or a termination) to a bounded thread
pool; at most one piece per pod is in flight. Updates that arrive while a pod's work is in
flight coalesce: the latest pod wins and it runs again at once when the work finishes. A kill
is never overwritten: once terminating, later updates only record that the source wants the
pod again (it restarts from scratch after it is terminated), and a later kill can only shrink
the grace.

A stream event that triggers a sync (a container stopped) may also be its runtime state (see
``runtime_events``): the worker keeps the pod's newest event while the sync is pending, drops it
when anything else asks for that sync (a source update, a PLEG event, a probe verdict, an error
retry), and hands it out with what the last successful syncs did (``effects``) and the current
sandbox, for the sync to check before using it.

Requeue: after a successful sync at ``resync * (1 + jitter * rand)`` rounded up to a whole
second (pods due in the same second share one wake-up of the loop), or earlier when a
back-off ends; after an error at ``error_delay * (1 + jitter * rand)``, or at the runtime
back-off (100 ms doubling to 5 s; ended early by ``runtime_answered``, the sync loop's probe)
when the runtime itself was unreachable, or at
``recovery_retry`` (0.5 s) within ``recovery_window`` (10 s) of the runtime answering again
after such an outage: a runtime restarted after a crash fails a call or two on the debris of
the calls it lost (containerd 1.6: a snapshot directory its rolled-back metadata reuses, "failed
to rename ... file exists"), which is no fault of the pod.

Not thread-safe: the loop thread only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from cri_api.v1 import api_pb2 as pb

from podvisor.services.pod import Pod
from podvisor.services.syncloop.actions import Waiting
from podvisor.services.syncloop.resizing import ResizeReport
from podvisor.services.syncloop.runtime_events import Effects, EventSnapshot
from podvisor.services.syncloop.states import WorkerState, check_transition


class WorkKind(StrEnum):
    SYNC = "sync"
    TERMINATE = "terminate"


@dataclass(frozen=True)
class Work:
    uid: str
    kind: WorkKind
    pod: Pod | None
    grace: int | None   # None: the pod's own (or, for an orphan, what its containers recorded)
    # A sync may use a shared runtime listing started at or after this (monotonic); None: read
    # the pod fresh (the runtime changed: an event or a probe verdict triggered it).
    newer_than: float | None = None
    # The stream event that triggered this sync, to use as the pod's runtime state when safe.
    snapshot: EventSnapshot | None = None
    active_since: float | None = None  # when the worker first saw the pod (activeDeadline)
    failed: bool = False  # the pod was failed for good (``SyncLoop.fail_pod``): stop everything
    fail_grace: int | None = None  # ... within this grace (None: the pod's own)


@dataclass(frozen=True)
class Outcome:
    ok: bool
    error: str = ""
    retry_after: float | None = None   # seconds; a back-off ends then
    runtime_down: bool = False         # the runtime could not be reached
    waiting: Mapping[str, Waiting] = field(default_factory=dict)
    sandbox_id: str | None = None
    pod_failed: bool = False
    effects: Effects = field(default_factory=dict)  # what the sync did to which container
    acted: bool = False  # the work called the runtime to change something
    network: bool = False  # held: a non-hostNetwork pod while the runtime's network is not ready
    deadline_exceeded: bool = False  # past activeDeadlineSeconds: the pod is Failed for good
    resize: ResizeReport | None = None  # a sync: its containers' actual resources (resize.py)


@dataclass
class Worker:
    uid: str
    pod: Pod | None          # None for a runtime pod no source knows (an orphan)
    source: str
    state: WorkerState = WorkerState.SYNCING
    admitted: bool = True
    reason: str = ""
    message: str = ""
    in_flight: bool = False
    pending: bool = True     # sync (or terminate) as soon as not in flight
    next_at: float = 0.0
    grace: int | None = None
    wanted_again: Pod | None = None
    waiting: Mapping[str, Waiting] = field(default_factory=dict)
    sandbox_id: str | None = None
    last_error: str = ""
    synced_at: float = 0.0   # when the last sync finished (or the worker was created)
    fresh: bool = False      # the next sync reads the runtime fresh (see Work.newer_than)
    read_after: float = 0.0  # the last sync handed out read the runtime as of this or later
    event: pb.ContainerEventResponse | None = None  # the pod's newest event (a pending sync's
    stops_seen: set[str] = field(default_factory=set)  # trigger) and the stops reported since
    not_event: bool = False  # something else asked for the pending sync: read the runtime
    effects: Effects | None = None  # what the last syncs did (None: unknown, after an error)
    active_since: float = 0.0  # when this worker first saw the pod (monotonic)
    failed: bool = False     # the pod was failed for good (``SyncLoop.fail_pod``: past its
    fail_grace: int | None = None  # activeDeadlineSeconds, or a FailPod), reason/message say why

    def set_state(self, new: WorkerState) -> None:
        check_transition(self.state, new)
        self.state = new


@dataclass(frozen=True)
class Timing:
    resync: float = 60.0
    error_delay: float = 10.0
    jitter: float = 0.5
    runtime_backoff_initial: float = 0.1
    runtime_backoff_cap: float = 5.0
    recovery_window: float = 10.0
    recovery_retry: float = 0.5


class WorkerTable:
    def __init__(self, timing: Timing, rand: Callable[[], float] = random.random) -> None:
        self.timing = timing
        self._rand = rand
        self.workers: dict[str, Worker] = {}
        self.runtime_delay = 0.0
        self.runtime_down_until = 0.0
        self.runtime_back_at = -math.inf  # when the runtime answered again after an outage

    def _jitter(self, delay: float) -> float:
        return delay * (1 + self.timing.jitter * self._rand())

    def get(self, uid: str) -> Worker | None:
        return self.workers.get(uid)

    def update(self, pod: Pod, source: str, now: float) -> Worker:
        """A source wants ``pod`` (added or changed): sync it now (or after its work)."""
        w = self.workers.get(pod.uid)
        if w is None:
            w = Worker(pod.uid, pod, source, next_at=now, synced_at=now, active_since=now)
            self.workers[pod.uid] = w
            return w
        if w.state is not WorkerState.SYNCING:
            w.wanted_again = pod   # a kill is never overwritten
            return w
        w.pod, w.source, w.pending = pod, source, True
        w.event, w.not_event = None, True
        return w

    def reconcile(self, pod: Pod) -> None:
        """Only ``pod``'s status changed (a condition another controller owns): the worker
        holds the new version, nothing is synced for it (the kubelet's HandlePodReconcile)."""
        w = self.workers.get(pod.uid)
        if w is not None and w.state is WorkerState.SYNCING and w.pod is not None:
            w.pod = pod
        elif w is not None and w.wanted_again is not None:
            w.wanted_again = pod

    def reject(self, pod: Pod, source: str, reason: str, message: str) -> Worker:
        """Admission refused ``pod``: keep it (for reporting) but never run it."""
        w = Worker(pod.uid, pod, source, admitted=False, reason=reason, message=message,
                   pending=False, next_at=float("inf"))
        self.workers[pod.uid] = w
        return w

    def kill(self, uid: str, grace: int | None, now: float, orphan: bool = False) -> bool:
        """Terminate the pod (``grace`` None = the pod's own). Returns whether it is known."""
        w = self.workers.get(uid)
        if w is None:
            if not orphan:
                return False
            w = Worker(uid, None, "runtime")
            self.workers[uid] = w
        w.wanted_again = None
        if w.state is WorkerState.SYNCING:
            w.set_state(WorkerState.TERMINATING)
            w.pending, w.next_at = True, now
        if grace is not None:
            w.grace = grace if w.grace is None else min(w.grace, grace)
        return True

    def trigger(self, uid: str, now: float, seen_at: float | None = None,
                event: pb.ContainerEventResponse | None = None) -> None:
        """Something changed in the runtime for this pod (a PLEG event, a container stopped, a
        probe verdict): sync it now, reading the runtime fresh, or from ``event`` (the stream's
        event that reported it) when nothing else asks for that sync. ``seen_at``: when the
        runtime showed the change; a sync handed out later read it already (the sync loop's own
        event stream beat PLEG's relist), so nothing is done."""
        w = self.workers.get(uid)
        if w is None or not w.admitted or w.state is WorkerState.TERMINATED:
            return
        if seen_at is not None and seen_at < w.read_after:
            return
        if event is None:
            w.event, w.not_event = None, True
        elif not w.not_event:
            w.event = event
            w.stops_seen.add(event.container_id)
        w.pending = w.fresh = True

    def supersede(self, uid: str, event: pb.ContainerEventResponse) -> None:
        """A later stream event of the pod (one that syncs nothing): it replaces the event a
        pending sync would use, as the newer state of the pod."""
        w = self.workers.get(uid)
        if w is not None and w.event is not None:
            w.event = event

    def due(self, now: float) -> list[Work]:
        """Work to hand out now; marks each worker in flight."""
        if now < self.runtime_down_until:
            return []
        out: list[Work] = []
        for w in self.workers.values():
            if w.in_flight or not w.admitted or w.state is WorkerState.TERMINATED:
                continue
            if not (w.pending or w.next_at <= now):
                continue
            w.in_flight, w.pending = True, False
            kind = WorkKind.SYNC if w.state is WorkerState.SYNCING else WorkKind.TERMINATE
            snap = None
            if (kind is WorkKind.SYNC and w.fresh and w.event is not None and not w.not_event
                    and w.effects is not None):
                snap = EventSnapshot(w.event, w.sandbox_id, w.effects, frozenset(w.stops_seen))
            out.append(Work(w.uid, kind, w.pod, w.grace, None if w.fresh else w.synced_at,
                            snap, w.active_since, w.failed, w.fail_grace))
            if snap is None:  # (an event's state is as of some time before it was published)
                w.read_after = now if w.fresh or kind is WorkKind.TERMINATE else w.synced_at
            w.fresh, w.event, w.not_event = False, None, False
            w.stops_seen = set()
        return out

    def finish(self, work: Work, outcome: Outcome, now: float) -> Worker | None:
        """Record the result of ``work``; returns the worker, or None once it is gone."""
        w = self.workers.get(work.uid)
        if w is None:
            return None
        w.in_flight = False
        w.synced_at = now
        self._runtime_health(outcome, now)
        if outcome.ok:
            w.last_error = ""
            if work.kind is WorkKind.TERMINATE:
                return self._terminated(w, now)
            w.waiting, w.sandbox_id = outcome.waiting, outcome.sandbox_id
            if outcome.effects or w.effects is None:
                w.effects = outcome.effects
            # on a whole second (the kubelet picks due pods on a 1 s tick): pods due in the
            # same second resync on one wake-up of the loop, not one each
            w.next_at = float(math.ceil(now + self._jitter(self.timing.resync)))
            if outcome.retry_after is not None:
                w.next_at = min(w.next_at, now + outcome.retry_after)
            return w
        w.last_error = outcome.error
        w.fresh = True  # retry against a fresh read
        w.event, w.not_event, w.effects = None, True, None
        if work.kind is WorkKind.SYNC:
            w.waiting = outcome.waiting or w.waiting
        if outcome.runtime_down:
            delay = self.runtime_delay
        elif now - self.runtime_back_at < self.timing.recovery_window:
            delay = self.timing.recovery_retry
        else:
            delay = self._jitter(self.timing.error_delay)
        if outcome.retry_after is not None:
            delay = min(delay, outcome.retry_after)
        w.next_at = now + delay
        return w

    def _runtime_health(self, outcome: Outcome, now: float) -> None:
        if not outcome.runtime_down:
            if self.runtime_delay > 0:  # the first answer after an outage
                self.runtime_back_at = now
            self.runtime_delay = 0.0
            self.runtime_down_until = 0.0
            return
        if now < self.runtime_down_until:
            return  # work handed out before this back-off began: the same outage, no doubling
        t = self.timing
        self.runtime_delay = min(t.runtime_backoff_cap,
                                 max(t.runtime_backoff_initial, self.runtime_delay * 2))
        self.runtime_down_until = now + self.runtime_delay

    def runtime_answered(self, now: float) -> None:
        """The runtime answers again (the sync loop's probe): its back-off ends now. The delay
        is kept, so that a failure right after doubles it as before."""
        self.runtime_down_until = min(self.runtime_down_until, now)

    def _terminated(self, w: Worker, now: float) -> Worker | None:
        w.set_state(WorkerState.TERMINATED)
        del self.workers[w.uid]
        if w.wanted_again is not None:
            return self.update(w.wanted_again, w.source, now)
        return None

    def next_deadline(self) -> float | None:
        """When ``due`` can next hand out work (the loop's poll timeout): the earliest
        ``next_at`` of a worker it would consider (at once for a pending one), never before
        ``runtime_down_until``. Workers ``due`` skips never count: a deadline it would not
        act on made the loop poll with a zero timeout until it passed (a busy spin)."""
        times = [-math.inf if w.pending else w.next_at for w in self.workers.values()
                 if not w.in_flight and w.admitted and w.state is not WorkerState.TERMINATED]
        if not times:
            return None
        return max(min(times), self.runtime_down_until)

    def idle(self) -> bool:
        return not any(w.in_flight for w in self.workers.values())
