"""The prober process: replicate ``desired`` and ``pleg``, run probe workers, own ``probes``.

One loop thread owns every socket and the ``ProbeManager``; probes run on a bounded thread pool
(``POOL_THREADS``) and post their outcomes back through a queue and a wake pipe, so a slow probe
never delays heartbeats, snapshot answers or other probes. At start the results saved in
``state/probes.json`` are published at once (before any replica is synced) and seed the workers
whose container ID still runs, so a restarted prober never flips a Ready pod to NotReady.
Nothing is computed until both replicas are synced and the PLEG cache has its ``_health`` key
(a fresh PLEG's empty map must not drop every result).
"""

from __future__ import annotations

import os
import queue
import random
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from podvisor.common.child import ChildContext
from podvisor.common.pool import ElasticPool
from podvisor.common.service import ServiceLoop, WakePipe
from podvisor.ipc.maps import DESIRED, HEALTH_KEY, PLEG, PROBES, DesiredPod, PodProbes, PodRef
from podvisor.services.pod import PodValidationError
from podvisor.services.prober.handlers import ProbeRunner
from podvisor.services.prober.manager import ProbeManager, ProbeTask
from podvisor.services.prober.outcome import Outcome
from podvisor.services.prober.store import ProbeStore
from podvisor.services.prober.worker import Result

MAP_NAME = PROBES
POOL_THREADS = 32
RETRY_SAVE = 1.0  # a failed save is retried this often
SNAPSHOT_TIMEOUT = 0.5
CALL_TIMEOUT = 4.0
HOLD = 0.05  # replica traffic waits at most this long after a drain (seconds)

_PROBE_RESULTS = {Result.SUCCESS: "successful", Result.FAILURE: "failed",
                  Result.UNKNOWN: "unknown"}


class ProberService:
    def __init__(self, ctx: ChildContext, runner: ProbeRunner,
                 rand: Callable[[], float] = random.random) -> None:
        clock = ctx.clock  # the one clock: the loop, the owner, the replicas and the publisher
        self.ctx, self._clock, self._wall = ctx, clock.monotonic, clock.wall
        self.store = ProbeStore(ctx.paths.state_dir / "probes.json", ctx.log)
        saved = self.store.load()
        self.loop = ServiceLoop(ctx)  # the poller, stop, heartbeats, the maps below, the clock
        self.pub = self.loop.publisher()
        self.owner = self.loop.owner(self.pub, MAP_NAME)
        for uid, value in saved.items():
            self.owner.set(uid, PodProbes.from_entry(value))
        self.manager = ProbeManager(rand, clock.monotonic(), saved, self._invalid_pod)
        # the kubelet's probe counter, served on the main port's /metrics/probes (in the agent
        # prometheus-client's multiprocess mode writes it to <rootDir>/run/metrics)
        self.probe_total = Counter(
            "prober_probe", "Cumulative number of a liveness, readiness or startup probe for a "
            "container by result", ["probe_type", "result", "container", "pod", "namespace"],
            registry=CollectorRegistry(auto_describe=False))
        self.runner = runner
        self.desired = self.loop.replica(DESIRED, self._on_desired,
                                         snapshot_timeout=SNAPSHOT_TIMEOUT)
        self.pleg = self.loop.replica(PLEG, self._on_pleg, snapshot_timeout=SNAPSHOT_TIMEOUT)
        self.pool = ElasticPool(max_workers=POOL_THREADS, thread_name_prefix="probe")
        self.results: queue.SimpleQueue[tuple[ProbeTask, Outcome]] = queue.SimpleQueue()
        self.wake = WakePipe()  # probe outcomes wake the loop
        self.loop.watch(self.wake.read_fd, self.wake.drain)
        self.ready = False
        self._changed = True
        self._dirty: set[str] | None = None  # pods changed since the last update (None: all)
        self._entries: dict[str, dict[str, Any]] = saved
        self._published = saved
        self._last_save = -RETRY_SAVE
        self._save_failed = False
        ctx.log.info("prober.started", loaded=sum(len(v) for v in saved.values()))

    def _invalid_pod(self, uid: str, err: PodValidationError) -> None:
        self.ctx.log.error("prober.pod.invalid", pod_uid=uid, error=err.summary(),
                           reason="not a validated pod (a bug upstream); no probes for it")

    def _on_change(self, key: str, old: Any, new: Any) -> None:
        self._changed = True
        if self._dirty is not None and not key.startswith("_"):
            self._dirty.add(key)

    def _on_desired(self, key: str, old: Any, new: Any) -> None:
        """Only pods with probes (before or after the change) need an update: a node of pods
        without probes costs the prober no work but receiving the maps."""
        if key.startswith("_") or self.manager.concerns(key, new):
            self._on_change(key, old, new)

    def _on_pleg(self, key: str, old: Any, new: Any) -> None:
        if key.startswith("_") or self.manager.concerns(key):
            self._on_change(key, old, new)

    # --- probing (pool threads) ---
    def _probe(self, task: ProbeTask) -> None:
        try:
            outcome = self.runner.run(task.probe, task.target)
        except Exception as err:  # never lose the in-flight mark
            outcome = Outcome(Result.FAILURE, f"probe error: {err}")
        self.results.put((task, outcome))
        self.wake.wake()

    # --- the loop's step ---
    def step(self) -> float:
        """Update workers, apply outcomes, hand out due probes, publish, save. Returns the
        seconds until the next due probe (capped)."""
        now = self._clock()
        if (self._changed and self.desired.synced and self.pleg.synced
                and self.pleg.get(HEALTH_KEY) is not None):
            self._changed = False
            dirty, self._dirty = self._dirty, set()
            self.manager.update(self.desired.items(), self.pleg.items(), now, self._wall(), dirty)
            if not self.ready:
                self.ctx.log.info("prober.synced", pid=os.getpid(),
                                  workers=len(self.manager.workers),
                                  desired_epoch=self.desired.epoch, pleg_epoch=self.pleg.epoch)
            self.ready = True
        while True:
            try:
                task, outcome = self.results.get_nowait()
            except queue.Empty:
                break
            self._record(task, outcome, now)
        if self.ready:
            for task in self.manager.due(now):
                self.pool.submit(self._probe, task)
            self._entries = self.manager.entries(now)
        if self._entries != self._published or (
                self._save_failed and now - self._last_save >= RETRY_SAVE):
            self.commit()
        return self._wait()

    def _wait(self) -> float:
        """Seconds the loop may block: the next due probe, heartbeat, map heartbeat, save
        retry, or snapshot retry, whichever comes first (probe outcomes wake it earlier)."""
        now = self._clock()
        deadlines = [now + self.ctx.heartbeat_interval, self.owner.next_tick()]
        deadline = self.manager.next_deadline() if self.ready else None
        if deadline is not None:
            deadlines.append(deadline)
        if self._save_failed:
            deadlines.append(self._last_save + RETRY_SAVE)
        if not (self.desired.synced and self.pleg.synced):
            deadlines.append(now + SNAPSHOT_TIMEOUT)
        return max(0.0, min(deadlines) - now)

    def _record(self, task: ProbeTask, outcome: Outcome, now: float) -> None:
        uid, name, kind = task.key
        before = self.manager.workers.get(task.key)
        old = before.result if before is not None else None
        changed = self.manager.complete(task, outcome.result, now)
        self._count(uid, name, str(kind), outcome.result)
        if outcome.result is not Result.SUCCESS:
            self.ctx.log.info("prober.probe.failed", pod_uid=uid, container=name,
                              probe=str(kind), result=str(outcome.result),
                              message=outcome.message[:300])
        if changed and before is not None and before.result is not old:
            self.ctx.log.info("prober.result", pod_uid=uid, container=name, probe=str(kind),
                              result=str(before.result), container_id=task.target.container_id)

    def _count(self, uid: str, container: str, kind: str, result: Result) -> None:
        entry = self.desired.get(uid)
        ref = entry.ref if isinstance(entry, DesiredPod) else PodRef()
        self.probe_total.labels(
            probe_type=kind.capitalize(), result=_PROBE_RESULTS[result], container=container,
            pod=ref.name, namespace=ref.namespace).inc()

    def commit(self) -> None:
        """Durable before visible: save the entries, then publish them. So a prober killed at
        any moment restarts with results at least as new as any reader saw (a disk error is
        logged and the entries are published anyway)."""
        entries = self._entries
        self._last_save = self._clock()
        self._save_failed = False
        try:
            self.store.save(entries)
        except OSError as err:
            self._save_failed = True
            self.ctx.log.error("prober.save_failed", path=str(self.store.path), error=str(err))
        for uid, value in entries.items():
            self.owner.set(uid, PodProbes.from_entry(value))
        for uid in set(self.owner.items()) - set(entries):
            self.owner.delete(uid)
        self._published = entries

    def turn(self, now: float) -> float:
        """The loop's step. Within ``HOLD`` of a drain of the replicas their traffic stays
        queued in zmq (a burst of pods starting is drained a few times, not once per update;
        probe outcomes, snapshot requests and due probes are not held): a change is seen at
        once, the next ones at most ``HOLD`` later, well within a probe period."""
        wait = self.step()
        self.loop.hold(self.loop.last_pump + HOLD)
        return self._clock() + wait

    def run(self) -> None:
        self.loop.run(self.turn)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self._entries != self._published:
            self.commit()
        self.loop.close()
        self.wake.close()
