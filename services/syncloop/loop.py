"""The sync loop's brain: sources in, pod workers driven, ``desired`` out. No sockets here.

``SyncLoop`` runs on one thread (the process's main loop in ``main.py`` feeds it bus messages
and calls ``step(now)``). Syncs, terminations and housekeeping run on a thread pool through
``submit``; each posts its result back with ``wake()`` and the loop thread applies it in
``step``. Tests drive it with the CRI fake and an inline ``submit``.

Network readiness (``network``): housekeeping refreshes it from CRI ``Status``; each change is
logged once (an event on the node: ``NetworkNotReady`` / ``NetworkReady``) and published under
the ``desired`` map's ``_runtime`` key (``/healthz`` shows it). While it is not ready, the syncs
of pods that are not ``hostNetwork`` are held on the loop thread (no CRI call; the pod's error
says "network is not ready: ...", an event says it once per pod) and retried at the error
delay; when it becomes ready they all sync at once.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from cri_api.v1 import api_pb2 as pb

from podvisor.ipc.maps import (
    RUNTIME_KEY,
    ContainerWaiting,
    DesiredPod,
    DesiredValue,
    PodResize,
)
from podvisor.services.cri import CriError
from podvisor.services.pod import Pod, PodValidationError, pod_from_wire, qos_class
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.admission import Capacity, admit
from podvisor.services.syncloop.network import Network, not_ready_error
from podvisor.services.syncloop.podconfig import PodConfig, PodOp, PodUpdate
from podvisor.services.syncloop.refusals import Refusals, refusals
from podvisor.services.syncloop.resizes import Resizes
from podvisor.services.syncloop.runtime_events import is_stop
from podvisor.services.syncloop.states import WorkerState
from podvisor.services.syncloop.syncpod import (
    DEADLINE_EXCEEDED,
    DEADLINE_MESSAGE,
    IN_FLIGHT_RETRY,
    SyncDeps,
    quiet_resync,
    sync_pod,
)
from podvisor.services.syncloop.terminate import terminate_pod
from podvisor.services.syncloop.workers import Outcome, Work, Worker, WorkerTable, WorkKind

HOUSEKEEPING_INTERVAL = 2.0
# Within housekeeping, two checks run less often than every 2 s: the runtime's Status (network
# readiness) at the kubelet's runtime-up check period, 5 s; the scan of the cgroup hierarchies
# for folders of pods nobody knows (left by a crashed agent or by containerd) every 30 s (the
# kubelet walks them at every housekeeping; here the scan was most of an idle loop's CPU).
# Folders of pods this agent terminated are retried at every housekeeping (``pending``).
RUNTIME_CHECK_INTERVAL = 5.0
LEFTOVER_SCAN_INTERVAL = 30.0
# While the runtime is down (a work found it UNAVAILABLE: no pod work is handed out until the
# runtime back-off, 100 ms doubling to 5 s, ends), CRI Version asks it this often whether it
# is back, one call at a time; its first answer ends the back-off, so the pods sync as soon as
# the runtime answers, not up to 5 s later (a restarted containerd waited out 1.6-3.2 s).
RUNTIME_PROBE_INTERVAL = 0.1


def _no_failures(uid: str) -> Collection[str]:
    return ()


class DesiredSink(Protocol):
    """Where the ``desired`` map goes (a ``MapOwner`` in the process)."""

    def set(self, key: str, value: DesiredValue) -> bool: ...

    def delete(self, key: str) -> bool: ...


@dataclass
class LoopDeps:
    sync: SyncDeps
    pod_config: PodConfig
    table: WorkerTable
    desired: DesiredSink
    submit: Callable[[Callable[[], None]], None]
    wake: Callable[[], None]
    housekeeping_interval: float = HOUSEKEEPING_INTERVAL
    runtime_check_interval: float = RUNTIME_CHECK_INTERVAL
    leftover_scan_interval: float = LEFTOVER_SCAN_INTERVAL
    runtime_probe_interval: float = RUNTIME_PROBE_INTERVAL
    # IDs of a pod's containers whose liveness/startup probe failed (the prober's verdicts);
    # called from pool threads.
    liveness_failed: Callable[[str], Collection[str]] = _no_failures
    # IDs of a pod's containers whose startup probe succeeded (a sidecar's gates the next init
    # container); called from pool threads
    started: Callable[[str], Collection[str]] = _no_failures
    node_name: str = ""  # the object of node-level events
    # called on the loop thread when a work changed containers in the runtime (PLEG's hint)
    changed_runtime: Callable[[], None] = lambda: None
    # the Node's allocatable for admission (OutOfpods/cpu/memory); None: standalone, no check
    capacity: Capacity | None = None
    # the node conditions the eviction manager holds True (the ``pressure`` map): admission
    # refuses pods under them as the kubelet's eviction admit handler
    pressure: Callable[[], Sequence[str]] = lambda: ()
    # a graceful node shutdown is under way (the ``node-shutdown`` map): admission refuses
    # every new pod as the kubelet's node shutdown manager (reason NodeShutdown)
    shutting_down: Callable[[], bool] = lambda: False
    # kubelet_pod_worker_duration_seconds: (operation_type, seconds) per finished work, and
    # kubelet_restarted_pods_total: (static) per pod restarted under the same UID (metrics.py)
    observe_work: Callable[[str, float], None] = lambda operation, seconds: None
    restarted: Callable[[bool], None] = lambda static: None


def desired_value(w: Worker, updated_at: float,
                  wire: tuple[dict[str, Any], str] | None = None,
                  resize: PodResize | None = None) -> DesiredPod:
    """``wire``: the pod's ``(to_dict(), QoS class)`` when the caller has them already;
    ``resize``: the pod's in-place resize state (``Resizes.state``)."""
    assert w.pod is not None
    pod, qos = wire if wire is not None else (w.pod.to_dict(), str(qos_class(w.pod)))
    return DesiredPod(
        pod=pod, source=w.source, worker=str(w.state), admitted=w.admitted,
        reason=w.reason, message=w.message or w.last_error,
        waiting={n: ContainerWaiting(x.reason, x.message) for n, x in w.waiting.items()},
        sandbox_id=w.sandbox_id or "", updated_at=updated_at, qos_class=qos, failed=w.failed,
        resize=resize or PodResize(),
    )


def _runtime_down(err: Exception) -> bool:
    return isinstance(err, CriError) and err.unavailable


class SyncLoop:
    def __init__(self, deps: LoopDeps) -> None:
        self.deps = deps
        self.log = deps.sync.log
        self._results: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._published: dict[str, DesiredPod] = {}
        # UID -> (the Pod, its wire form, QoS class): a worker's Pod object is replaced only
        # on a real change, so each publish (twice per sync) does not serialize it again
        self._wire: dict[str, tuple[Pod, dict[str, Any], str]] = {}
        self._next_housekeeping = 0.0
        self._next_runtime_check = 0.0
        self._next_leftover_scan = 0.0  # moved on only by a scan that ran
        self._housekeeping_busy = False
        self._probing = False  # a runtime probe is in flight (while the runtime is down)
        self._next_probe = 0.0
        self._removed: dict[str, float] = {}  # UID -> when its pod was terminated (monotonic)
        self.stopping = False
        # stop_all: a runtime listing begun after it killed every pod it found (the pods a
        # sync loop restarted just now has not loaded yet, or no source names any more)
        self._stop_swept = False
        self._network: Network | None = None  # as last published under RUNTIME_KEY
        self._held: set[str] = set()  # pods held while the network is not ready
        # the worker metrics: work handed out (UID -> operation_type, when), workers whose
        # first sync went out, and pods a source changed since their last sync went out
        self._handed: dict[str, tuple[str, float]] = {}
        self._created: set[str] = set()
        self._updated: set[str] = set()
        if deps.sync.objects is not None:  # a watched ConfigMap/Secret changed: sync its pods
            deps.sync.objects.on_pods_changed = self._objects_changed
        self._refusals = Refusals(deps.table, self.log)
        self._resizes = Resizes(deps.sync.allocation, self.log, self._capacity())

    # --- inputs (loop thread) ---
    def handle_pod_set(self, source: str, pods: Sequence[Any], now: float,
                       errors: Sequence[Mapping[str, Any]] = ()) -> None:
        """A source's full set, as the source published it: wire forms of pods it validated
        (``Pod.to_dict()``), rebuilt without a second validation. Anything else is a bug
        upstream: that pod is dropped with an error logged, the others go on. ``errors``: the
        set's refused inputs; those naming a pod (API pods) are refused as the kubelet does
        (``refusals``): rejected if not running, else the update is refused and it runs on."""
        parsed: list[Pod] = []
        for raw in pods:
            try:
                parsed.append(pod_from_wire(raw, where=f"{source} set"))
            except PodValidationError as err:
                self.log.error("syncloop.pod.invalid", source=source, error=err.summary(),
                               reason="not a validated pod (a bug upstream); dropped")
        refused = refusals(errors)
        for update in self.deps.pod_config.apply(source, parsed, keep=refused.keys()):
            self._apply(update, now)
        wanted = {p.uid: p for p in self.deps.pod_config.pods()}
        for uid in sorted(self._refusals.apply(source, refused, wanted)):
            self._publish(uid)

    def _apply(self, update: PodUpdate, now: float) -> None:
        table = self.deps.table
        for pod in update.pods:
            w = table.get(pod.uid)
            if update.op in (PodOp.ADD, PodOp.UPDATE):
                if self.stopping and w is None:
                    continue
                if w is None or not w.admitted:
                    self._admit(pod, update.source, now)
                else:
                    table.update(pod, update.source, now)
                    self._updated.add(pod.uid)
                self._register_objects(pod)
                self.log.info("syncloop.pod.update", op=str(update.op), pod=pod.full_name,
                              pod_uid=pod.uid, source=update.source)
                if pod.metadata.deletion_timestamp:  # first seen being deleted (a relist after
                    # an outage): terminating at once, never started (the kubelet's pod worker)
                    self._kill(pod.uid, pod.metadata.deletion_grace_period_seconds, now)
            elif update.op in (PodOp.DELETE, PodOp.REMOVE):
                grace = (pod.metadata.deletion_grace_period_seconds
                         if update.op is PodOp.DELETE else None)
                self._kill(pod.uid, grace, now)
            elif update.op is PodOp.RECONCILE:
                table.reconcile(pod)  # only its status changed (a readiness gate's condition)
            if update.op in (PodOp.ADD, PodOp.UPDATE, PodOp.RECONCILE):
                self._failed_in_api(pod, update.source)
            self._publish(pod.uid)

    def _failed_in_api(self, pod: Pod, source: str) -> None:
        """An API pod whose status in the API is Failed already (failed through ``fail_pod``
        by this or an earlier sync loop: evicted, past its deadline; or rejected) is terminal:
        it never runs again, with the reason and message the API holds, as the kubelet's pod
        worker treats a pod whose API phase is terminal. A restarted sync loop so never
        restarts an evicted pod's containers. No new Event: one was recorded when it failed."""
        if source == "api" and pod.status.get("phase") == "Failed":
            self.fail_pod(pod.uid, str(pod.status.get("reason") or ""),
                          str(pod.status.get("message") or ""), announce=False)

    def _admit(self, pod: Pod, source: str, now: float) -> None:
        admitted = (self._resizes.allocated(w.pod) for w in self.deps.table.workers.values()
                    if w.admitted and w.pod is not None and w.uid != pod.uid
                    and w.state is WorkerState.SYNCING and not w.failed)  # (filterOutInactivePods)
        # (the others with their allocated resources, as the kubelet's allocation manager)
        rejection = admit(pod, admitted, self.deps.capacity, self.deps.pressure(),
                          self.deps.shutting_down())
        if rejection is None:
            if (w := self.deps.table.get(pod.uid)) is not None and not w.admitted:
                del self.deps.table.workers[pod.uid]
            self.deps.table.update(pod, source, now)
            return
        self.deps.table.reject(pod, source, rejection.reason, rejection.message)
        self.log.warning("syncloop.pod.rejected", pod=pod.full_name, pod_uid=pod.uid,
                         reason=rejection.reason, message=rejection.message)

    def _register_objects(self, pod: Pod) -> None:
        """An admitted API pod's ConfigMaps/Secrets are watched from now on (the kubelet's
        ``RegisterPod``); the watches go when its termination is done."""
        objects = self.deps.sync.objects
        w = self.deps.table.get(pod.uid)
        if objects is not None and w is not None and w.admitted:
            objects.register_pod(pod)

    def _objects_changed(self, uids: frozenset[str]) -> None:
        """A watch's thread: objects these pods reference changed; sync them now (they
        rewrite their volumes; a container's env is read when it is created)."""

        def trigger() -> None:
            now = self.deps.sync.mono()
            for uid in sorted(uids):
                self.deps.table.trigger(uid, now)
        self._post(trigger)

    def _kill(self, uid: str, grace: int | None, now: float) -> None:
        w = self.deps.table.get(uid)
        if w is not None and not w.admitted:
            del self.deps.table.workers[uid]
            return
        if self.deps.table.kill(uid, grace, now):
            self.log.info("syncloop.pod.kill", pod_uid=uid, grace=grace)

    def handle_pleg_event(self, uid: str, now: float, seen_at: float | None = None) -> None:
        """``seen_at``: when the runtime showed the change (a PLEG event's relist start);
        None = now."""
        self.deps.table.trigger(uid, now, seen_at)

    def handle_container_event(self, uid: str, event: pb.ContainerEventResponse,
                               now: float, seen_at: float | None = None) -> None:
        """An event of the sync loop's own stream: a stop syncs the pod (with the event as its
        runtime state when safe); any other event only supersedes a pending stop's state.
        ``seen_at``: when the runtime published it (monotonic); None = now."""
        if is_stop(event):
            self.deps.table.trigger(uid, now, seen_at, event)
        else:
            self.deps.table.supersede(uid, event)

    def stop_all(self, now: float) -> None:
        """Terminate every pod (each within its grace) and admit nothing new: the ones the
        sources name now, then every other pod the runtime lists (a housekeeping pass begun
        after this, whether or not the sources are ready: a sync loop restarted moments ago
        knows none of its pods yet)."""
        self.stopping = True
        self._stop_swept = False
        for uid in list(self.deps.table.workers):
            self._kill(uid, None, now)
            self._publish(uid)
        if not self._housekeeping_busy:
            self._next_housekeeping = now
        self.log.info("syncloop.pods.stopall", pods=len(self.deps.table.workers))

    def all_stopped(self) -> bool:
        """Every pod stopped since ``stop_all``: none left of those known, and a runtime
        listing begun after it found none else (or had them killed: they are workers then)."""
        return self._stop_swept and not self.deps.table.workers and not self._housekeeping_busy

    # --- the step (loop thread) ---
    def step(self, now: float) -> float | None:
        """Apply finished work, hand out due work, housekeep; returns seconds until the next
        deadline (None = nothing scheduled)."""
        while True:
            try:
                self._results.get_nowait()()
            except queue.Empty:
                break
        works = [self._allocate(work) for work in self.deps.table.due(now)]
        for work in works:
            self._handed[work.uid] = (self._operation(work), now)
        for work in works:  # first: a pool thread starts while the loop publishes
            if not self._hold(work) and not self._quiet(work):
                self.deps.submit(lambda work=work: self._run(work))  # type: ignore[misc]
        for work in works:
            self._publish(work.uid)
        down = now < self.deps.table.runtime_down_until
        if down and not self._probing and now >= self._next_probe:
            self._probing = True
            self._next_probe = now + self.deps.runtime_probe_interval
            self.deps.submit(self._probe_runtime)
        if now >= self._next_housekeeping and not self._housekeeping_busy:
            self._next_housekeeping = now + self.deps.housekeeping_interval
            self._housekeeping_busy = True
            known = frozenset(self.deps.table.workers)
            check = now >= self._next_runtime_check
            if check:
                self._next_runtime_check = now + self.deps.runtime_check_interval
            scan = now >= self._next_leftover_scan
            sweep = self.stopping
            self.deps.submit(lambda: self._housekeeping(known, check, scan, sweep))
        deadline = self.deps.table.next_deadline()
        # a housekeeping still running is due again only once it is done (its result wakes
        # the loop): its past deadline would make the loop spin meanwhile
        waits = [] if self._housekeeping_busy else [self._next_housekeeping - now]
        if deadline is not None:
            waits.append(deadline - now)
        if down and not self._probing:
            waits.append(self._next_probe - now)
        return max(0.0, min(waits)) if waits else None

    def _capacity(self) -> Capacity:
        """What a resize must fit in: the Node's allocatable when it is a cluster node, else
        the node's CPUs and memory."""
        if self.deps.capacity is not None:
            return self.deps.capacity
        node = self.deps.sync.node
        return Capacity(node.cpu_millis, node.memory_bytes, 1 << 30)

    def _allocate(self, work: Work) -> Work:
        """A sync runs the pod with its allocated resources; a spec that differs from them is
        a resize request, decided here on the loop thread (one at a time, as the kubelet's
        podResizeMutex) against the other pods' allocations (``Resizes.decide``)."""
        if work.kind is not WorkKind.SYNC or work.pod is None or work.failed:
            return work
        table = self.deps.table

        def others() -> Iterator[Pod]:
            for w in table.workers.values():
                if w.admitted and w.pod is not None and w.uid != work.uid \
                        and w.state is WorkerState.SYNCING and not w.failed:
                    yield self._resizes.allocated(w.pod)

        pod = self._resizes.decide(work.pod, others(), self.deps.sync.backoff)
        return work if pod is work.pod else replace(work, pod=pod)

    def _operation(self, work: Work) -> str:
        """The kubelet's ``operation_type`` of a work being handed out (see metrics.py)."""
        if work.kind is WorkKind.TERMINATE:
            return "kill"
        if work.uid not in self._created:
            self._created.add(work.uid)
            self._updated.discard(work.uid)
            return "create"
        if work.uid in self._updated:
            self._updated.discard(work.uid)
            return "update"
        return "sync"

    def _hold(self, work: Work) -> bool:
        """A sync of a pod that is not hostNetwork while the network is known not ready ends
        here, as an error, without a CRI call (the kubelet's syncPod refuses it the same way)."""
        network = self.deps.sync.network.current if self.deps.sync.network else None
        if (work.kind is not WorkKind.SYNC or work.pod is None or work.pod.spec.host_network
                or network is None or network.ready):
            return False
        self._finish(work, Outcome(ok=False, error=not_ready_error(network), network=True))
        return True

    def _quiet(self, work: Work) -> bool:
        """A periodic resync that needs no CRI call is done here, on the loop thread
        (``quiet_resync``); True when it was."""
        if work.kind is not WorkKind.SYNC or work.pod is None or work.snapshot is not None \
                or work.newer_than is None:
            return False
        try:
            r = quiet_resync(self.deps.sync, work.pod, self.deps.liveness_failed(work.uid),
                             work.newer_than, self.deps.started(work.uid), work.active_since,
                             work.failed, work.fail_grace)
        except Exception:  # a bug here must not take the loop down: the pool path decides
            self.log.exception("syncloop.quiet_resync.crashed", pod_uid=work.uid)
            return False
        if r is None:
            return False
        self._finish(work, Outcome(ok=True, retry_after=r.retry_after, waiting=r.waiting,
                                   sandbox_id=r.sandbox_id, pod_failed=r.pod_failed,
                                   deadline_exceeded=r.deadline_exceeded, resize=r.resize))
        return True

    def _probe_runtime(self) -> None:
        """Pool thread: does the runtime answer again?"""
        try:
            self.deps.sync.cri.version()
            back = True
        except CriError:
            back = False
        except Exception:  # a bug here must not keep the probe from ever running again
            self.log.exception("syncloop.runtime.probe_crashed")
            back = False
        self._post(lambda: self._probe_done(back))

    def _probe_done(self, back: bool) -> None:
        self._probing = False
        now = self.deps.sync.mono()
        if back and now < self.deps.table.runtime_down_until:
            self.deps.table.runtime_answered(now)
            self.log.info("syncloop.runtime.back", reason="the runtime answers again")

    def _post(self, fn: Callable[[], None]) -> None:
        self._results.put(fn)
        self.deps.wake()

    # --- work (pool threads) ---
    def _run(self, work: Work) -> None:
        try:
            outcome = self._sync(work) if work.kind is WorkKind.SYNC else self._terminate(work)
        except Exception as err:  # never let one pod take the loop down
            if not isinstance(err, CriError):
                self.log.exception("syncloop.work.crashed", pod_uid=work.uid, kind=str(work.kind))
            else:
                self.log.warning("syncloop.work.failed", pod_uid=work.uid, kind=str(work.kind),
                                 error=str(err))
            outcome = Outcome(ok=False, error=str(err), runtime_down=_runtime_down(err),
                              retry_after=IN_FLIGHT_RETRY
                              if isinstance(err, CriError) and err.name_reserved else None)
        self._post(lambda: self._finish(work, outcome))

    def _sync(self, work: Work) -> Outcome:
        assert work.pod is not None
        r = sync_pod(self.deps.sync, work.pod, self.deps.liveness_failed(work.uid),
                     work.newer_than, work.snapshot, self.deps.started(work.uid),
                     work.active_since, work.failed, work.fail_grace)
        return Outcome(ok=r.ok, error="; ".join(r.errors), retry_after=r.retry_after,
                       waiting=r.waiting, sandbox_id=r.sandbox_id, pod_failed=r.pod_failed,
                       effects=r.effects, acted=r.acted, network=bool(r.network_error),
                       runtime_down=r.runtime_down, deadline_exceeded=r.deadline_exceeded,
                       resize=r.resize)

    def _terminate(self, work: Work) -> Outcome:
        d = self.deps.sync
        _, _, left = terminate_pod(d.cri, d.log, work.uid, work.pod, work.grace, d.sleep, d.mono,
                                   d.wall, d.pods_dir, d.crash)
        if not left.empty:
            return Outcome(ok=False, error="containers or sandboxes remain after teardown")
        d.backoff.forget_pod(work.uid)
        if d.cgroups is not None:  # a folder still busy is retried at housekeeping
            d.cgroups.remove(work.uid, kill_left=True)  # (processes left in it are killed)
        return Outcome(ok=True)

    def _finish(self, work: Work, outcome: Outcome) -> None:
        cache = self.deps.sync.cache
        if cache is not None and (outcome.acted or (not outcome.ok and not outcome.network)
                                  or work.kind is WorkKind.TERMINATE):
            cache.changed()  # a listing from before may miss what the work did (a held
            # sync did nothing)
        if outcome.acted or work.kind is WorkKind.TERMINATE:
            self.deps.changed_runtime()
        now = self.deps.sync.mono()
        if outcome.resize is not None:
            self._resizes.reported(work.uid, outcome.resize)
        w = self.deps.table.finish(work, outcome, now)
        handed = self._handed.pop(work.uid, None)
        if handed is not None:
            self.deps.observe_work(handed[0], now - handed[1])
        if work.kind is WorkKind.SYNC:
            self._note_held(work, outcome)
            if outcome.deadline_exceeded and w is not None:
                self._deadline_exceeded(w)
        if work.kind is WorkKind.TERMINATE and outcome.ok:
            self._created.discard(work.uid)  # a restarted pod's next sync is a create again
            self._updated.discard(work.uid)
            if w is not None:  # wanted again while it terminated: a restart, same UID
                self.deps.restarted(w.source != "api")
                self.log.info("syncloop.pod.restarted", pod=w.pod.full_name if w.pod else "",
                              pod_uid=work.uid, source=w.source)
        if work.kind is WorkKind.TERMINATE and w is None:
            self._resizes.forget(work.uid)
            self._removed[work.uid] = self.deps.sync.mono()
            if self.deps.sync.objects is not None:  # its ConfigMaps/Secrets: unwatched
                self.deps.sync.objects.unregister_pod(work.uid)
            self.log.info("syncloop.pod.terminated", pod_uid=work.uid)
        self._publish(work.uid)

    def _deadline_exceeded(self, w: Worker) -> None:
        """The pod ran past ``activeDeadlineSeconds`` (the kubelet's activeDeadlineHandler; the
        sync that saw it stopped its containers already)."""
        self.fail_pod(w.uid, DEADLINE_EXCEEDED, DEADLINE_MESSAGE, event_type="Normal")

    def fail_pod(self, uid: str, reason: str, message: str, grace: int | None = None,
                 event_type: str = "Warning", announce: bool = True) -> bool:
        """Fail the pod for good: the one way a pod ends Failed with a reason, whoever decides
        it (the deadline above; another process with a ``FailPod`` on the bus, as the kubelet's
        eviction manager kills a pod with a status of phase Failed). Its next syncs stop every
        container (within ``grace`` seconds; None: the pod's own) and start none; ``desired``
        says ``failed`` with ``reason`` and ``message``, so its status is phase Failed with them
        (``status/compute.py``), in /pods and the API; a ``syncloop.pod.failed`` line carries
        them and ``event_type`` to an Event (``announce`` False: a pod the API says is Failed
        already, ``_failed_in_api``: no second Event). The pod stays until its source deletes
        it; its resources no longer count at admission. False (nothing done) for a pod the loop
        does not run, is terminating, or failed already."""
        w = self.deps.table.get(uid)
        if (w is None or w.pod is None or not w.admitted or w.failed
                or w.state is not WorkerState.SYNCING):
            return False
        w.failed, w.fail_grace, w.reason, w.message = True, grace, reason, message
        self.deps.table.trigger(uid, self.deps.sync.mono())  # its containers: stopped now
        if announce:
            say = self.log.warning if event_type == "Warning" else self.log.info
            say("syncloop.pod.failed", pod=w.pod.full_name, pod_uid=uid, reason=reason,
                message=message, event_type=event_type)
        else:
            self.log.info("syncloop.pod.failed_in_api", pod=w.pod.full_name, pod_uid=uid,
                          reason=reason, message=message)
        self._publish(uid)
        self.deps.wake()
        return True

    def _note_held(self, work: Work, outcome: Outcome) -> None:
        """Say once per pod that it waits for the network; forget it once it synced."""
        if not outcome.network:
            if outcome.ok:
                self._held.discard(work.uid)
            return
        if work.uid not in self._held and self.deps.table.get(work.uid) is not None:
            self._held.add(work.uid)
            self.log.warning("syncloop.pod.network_not_ready",
                             pod=work.pod.full_name if work.pod else "", pod_uid=work.uid,
                             message=outcome.error)

    def _network_seen(self, network: Network | None, now: float) -> None:
        """Loop thread: a fresh NetworkReady reading (None: the runtime did not answer)."""
        if network is None or network == self._network:
            return
        before, self._network = self._network, network
        self.deps.desired.set(RUNTIME_KEY, network.to_value())
        if not network.ready:
            self.log.warning("syncloop.runtime.network_not_ready", node=self.deps.node_name,
                             reason=network.reason, message=network.condition_text())
            return
        if before is not None:
            self.log.info("syncloop.runtime.network_ready", node=self.deps.node_name,
                          message=network.condition_text(), held=len(self._held))
        for uid in sorted(self._held):  # the pods waiting for it sync now
            self.deps.table.trigger(uid, now)
        self._held.clear()

    def _housekeeping(self, known: frozenset[str], check: bool = True,
                      scan: bool = True, sweep: bool = False) -> None:
        """Pool thread. ``known``: the workers' UIDs when it was submitted. The runtime's pod
        UIDs come from the shared listing when it is at most one interval old. ``check``: ask
        the runtime's Status (network readiness); ``scan``: look for leftover cgroup folders
        (done only once the sources are ready and the listing worked); ``sweep``: begun after
        ``stop_all``: the runtime is listed afresh, sources ready or not, and every pod it
        lists that no worker stops is killed as an orphan."""
        uids: set[str] = set()
        error: Exception | None = None
        ready = self.deps.pod_config.sources_ready()
        d = self.deps.sync
        listed_at = d.mono()
        if ready or sweep:
            try:
                if d.cache is not None and not sweep:
                    uids, listed_at = d.cache.pod_uids(self.deps.housekeeping_interval)
                else:
                    uids = {s.labels.get(L.POD_UID, "") for s in d.cri.list_pod_sandbox()}
                    uids |= {c.labels.get(L.POD_UID, "") for c in d.cri.list_containers()}
                    uids.discard("")
            except CriError as err:
                error = err
        stale: set[str] = set()  # pods whose cgroup folders should go
        scanned = scan and ready and error is None
        if d.cgroups is not None:
            stale = d.cgroups.pending() - uids
            if scanned:
                stale |= d.cgroups.leftovers(known | uids)
        d.backoff.gc(d.mono())
        d.sandbox_backoff.gc(d.mono())
        network = d.network.refresh(d.cri) if d.network is not None and check else None
        self._post(lambda: self._housekeeping_done(uids, error, stale, listed_at, network,
                                                   scanned, sweep))

    def _housekeeping_done(self, runtime_uids: set[str], error: Exception | None,
                           stale_cgroups: set[str], listed_at: float,
                           network: Network | None = None, scanned: bool = False,
                           sweep: bool = False) -> None:
        self._housekeeping_busy = False
        if scanned:
            self._next_leftover_scan = self.deps.sync.mono() + self.deps.leftover_scan_interval
        self._network_seen(network, self.deps.sync.mono())
        # a pod terminated after the listing started is no orphan, whatever it showed
        self._removed = {u: t for u, t in self._removed.items() if t >= listed_at}
        # On the loop thread, so no worker for these UIDs can appear (and create the folder)
        # while they are removed; rmdir of a few empty folders is quick.
        cgroups = self.deps.sync.cgroups
        if cgroups is not None:
            for uid in sorted(stale_cgroups - set(self.deps.table.workers)):
                cgroups.remove(uid)
        if error is not None:
            self.log.warning("syncloop.housekeeping.failed", error=str(error))
            return
        now = self.deps.sync.mono()
        for uid in runtime_uids - set(self.deps.table.workers) - set(self._removed):
            self.log.info("syncloop.pod.orphan", pod_uid=uid)
            self.deps.table.kill(uid, None, now, orphan=True)
        if sweep and self.stopping:
            self._stop_swept = True
        if self.deps.pod_config.sources_ready():  # allocations of pods gone while it was down
            self._resizes.retain(set(self.deps.table.workers) | runtime_uids)

    # --- desired map ---
    def _publish(self, uid: str) -> None:
        w = self.deps.table.get(uid)
        if w is None or w.pod is None:
            self._published.pop(uid, None)
            self._wire.pop(uid, None)
            self.deps.desired.delete(uid)
            return
        cached = self._wire.get(uid)
        if cached is None or cached[0] is not w.pod:
            cached = (w.pod, w.pod.to_dict(), str(qos_class(w.pod)))
            self._wire[uid] = cached
        value = desired_value(w, 0.0, cached[1:], self._resizes.state(w.pod))
        old = self._published.get(uid)
        if old is not None and replace(old, updated_at=0.0) == value:
            return
        value = replace(value, updated_at=self.deps.sync.wall())
        before = old.waiting if old is not None else {}
        for name, waiting in value.waiting.items():  # a new waiting reason: log it (an event)
            seen = before.get(name)
            if seen is None or seen.reason != waiting.reason:
                self.log.info("syncloop.container.waiting", pod=w.pod.full_name, pod_uid=uid,
                              container=name, reason=waiting.reason, message=waiting.message)
        self._published[uid] = value
        self.deps.desired.set(uid, value)
