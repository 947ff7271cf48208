"""The status process: replicate ``desired`` and ``pleg``, own and persist ``statuses``.

Loop: block on both replicas, the ``statuses`` snapshot socket and the stop fd until something
arrives or the next deadline (heartbeat, map heartbeat, the sweep, a pending snapshot); when a
replica changed recompute the pods whose inputs changed, then commit. Computes are at least
``COALESCE`` apart: a lone change is computed at once, a burst (200 pods starting) in batches,
so a pod whose container was created and started within the window gets one new version, one
file write and one update instead of two. Every ``SWEEP_PERIOD`` retired statuses expire; every
``FULL_SWEEP_PERIOD`` every pod is recomputed (a safety net: a status depends only on its own
inputs, so this finds nothing; the kubelet's 10 s sweep pushes statuses to the API server,
which podvisor's replicated map does on its own).

Durable before visible: a commit writes the changed statuses to ``state/statuses/`` (store.py:
one journal line per commit, no fsync: the failure model is kill -9) and publishes them only then.
Every turn that computed changes commits them at once; what arrived within one turn (every
queued update is drained before computing) goes out in one commit. So whatever a reader has seen
is on disk: a status process killed at any moment comes back with statuses at least as new as
any it published, and at start it publishes those at once, before any recompute (no
``_version`` going back, no readiness flip, no transition recomputed with a new time). If the
disk fails, changes are still published (and the failure logged); the save is retried.

Clocks: monotonic for the loop; wall time only for the timestamps written into statuses.
"""

from __future__ import annotations

import math
import os
from typing import Any

from podvisor.common.child import ChildContext
from podvisor.common.config import Config
from podvisor.common.endpoint import runtime_name
from podvisor.common.service import ServiceLoop
from podvisor.ipc.faults import ROOT_DIR_TARGET, ActiveFault
from podvisor.ipc.maps import DESIRED, PLEG, PROBES, STATUSES, DesiredValue, PodStatusValue
from podvisor.services.status.compute import desired_inputs
from podvisor.services.status.engine import Changes, StatusEngine, Transition
from podvisor.services.status.metrics import PodStartTimer
from podvisor.services.status.store import StatusStore

MAP_NAME = STATUSES
SWEEP_PERIOD = 10.0  # retired statuses expire (only when there are some)
FULL_SWEEP_PERIOD = 300.0  # every pod recomputed
COALESCE = 0.02  # computes at least this far apart (seconds)
RETRY_SAVE = 1.0  # a failed save is retried this often
SNAPSHOT_TIMEOUT = 0.5  # a missing owner stalls one loop turn at most this long per replica
PROBES_WAIT = 10.0  # compute without the prober's ``probes`` map after this long (prober down)

def store_path(ctx: ChildContext) -> Any:
    return ctx.paths.state_dir / "statuses"


def host_ips(config: Config) -> tuple[str, ...]:
    """The pods' ``hostIP``/``hostIPs``: ``nodeIP`` when set (the Node's InternalIPs, as the
    kubelet reports them), else the address the agent serves on (127.0.0.1 by default)."""
    return config.node_ips or (config.address or "127.0.0.1",)


class StatusService:
    def __init__(self, ctx: ChildContext) -> None:
        self.ctx = ctx
        clock = ctx.clock  # the one clock: the loop, the owner, the replicas and the publisher
        self._clock = clock.monotonic
        self._wall = clock.wall
        self.store = StatusStore(store_path(ctx), ctx.log)
        self.engine = StatusEngine(self.store.load(), runtime_name(ctx.config.runtime_endpoint),
                                   host_ips(ctx.config),
                                   ctx.config.supervision.log_level == "debug")
        self.loop = ServiceLoop(ctx)  # the poller, stop, heartbeats, the maps below, the clock
        self.pub = self.loop.publisher()
        self.owner = self.loop.owner(self.pub, MAP_NAME, heartbeat_interval=1.0)
        for uid, value in self.engine.statuses.items():
            self.owner.set(uid, value)
        self.pod_start = PodStartTimer()  # multiprocess directory in the agent
        self._dirty = False
        self._pending_set: dict[str, PodStatusValue] = {}
        self._pending_deleted: set[str] = set()
        self._changed = True
        self._dirty_uids: set[str] = set()  # pods whose inputs changed since the last compute
        self._full = True  # the next compute covers every pod (start, sweep)
        self.desired = self.loop.replica(DESIRED, self._on_desired,
                                         snapshot_timeout=SNAPSHOT_TIMEOUT)
        self.pleg = self.loop.replica(PLEG, self._on_change, snapshot_timeout=SNAPSHOT_TIMEOUT)
        self.probes = self.loop.replica(PROBES, self._on_change,
                                        snapshot_timeout=SNAPSHOT_TIMEOUT)
        self._started = clock.monotonic()
        self._last_save = -RETRY_SAVE
        self._last_sweep = self._last_full = clock.monotonic()
        self._last_compute = -math.inf
        self._inputs: tuple[str | None, str | None] | None = None
        self._state_faults: frozenset[str] = frozenset()
        self.loop.on_faults(self._on_faults)

    def _on_change(self, key: str, old: object, new: object) -> None:
        self._changed = True
        if not key.startswith("_"):
            self._dirty_uids.add(key)

    def _on_faults(self, faults: tuple[ActiveFault, ...]) -> None:
        """A disk fault on rootDir began or ended: the journal kept open is reopened (through
        the fault's mount, or the directory again) and the next save writes the files whole
        (lines appended to the journal just before may have gone to the other side)."""
        ids = frozenset(f.id for f in faults
                        if f.spec.kind == "disk" and f.spec.target == ROOT_DIR_TARGET)
        if ids != self._state_faults:
            self._state_faults = ids
            self.store.reopen()
            self._dirty = True

    def _on_desired(self, key: str, old: DesiredValue | None, new: DesiredValue | None) -> None:
        """A ``desired`` change that touches nothing a status reads (the sync loop's
        ``sandbox_id``, ``updated_at``, ``worker``) recomputes nothing."""
        if not key.startswith("_"):
            if new is None:
                self.pod_start.gone(key)
            elif old is None and key not in self.engine.statuses \
                    and key not in self.engine.retired:
                self.pod_start.seen(key, self._clock())
        if key.startswith("_") or desired_inputs(old) != desired_inputs(new):
            self._on_change(key, old, new)

    def step(self) -> Changes | None:
        """Recompute when something changed (at most every ``COALESCE``) or a sweep is due;
        commit (save, then publish) what changed."""
        now = self._clock()
        result = None
        if now - self._last_full >= FULL_SWEEP_PERIOD:
            self._full = True
        if now - self._last_sweep >= SWEEP_PERIOD:
            self._last_sweep = now
            self._expire(now)
        due = self._full or (self._changed and now - self._last_compute >= COALESCE)
        # Readiness verdicts come from the prober: wait for its map (bounded), so a restarted
        # status process never turns probed Ready pods NotReady for lack of them.
        probes_ok = self.probes.synced or now - self._started >= PROBES_WAIT
        if due and self.desired.synced and self.pleg.synced and probes_ok:
            result = self.engine.reconcile(self.desired.items(), self.pleg.items(), self._wall(),
                                           now, self.probes.items(),
                                           None if self._full else self._dirty_uids)
            if result is not None:
                if self._full:
                    self._last_full = now
                self._last_compute = now
                self._changed = self._full = False
                self._dirty_uids = set()
                self._queue(result)
                self._log_inputs(result)
                for uid, why in result.invalid.items():
                    self.ctx.log.error("status.pod.invalid", pod_uid=uid, error=why,
                                       reason="not a validated pod (a bug upstream); no status")
                self.pod_start.computed(result.set, result.deleted, now)
        if self._pending_set or self._pending_deleted or (
                self._dirty and now - self._last_save >= RETRY_SAVE):
            self.commit()
        return result

    def _expire(self, now: float) -> None:
        """Drop retired statuses past their time (the next commit removes their files)."""
        if self.engine.retired and self.engine.expire(self._wall()):
            self._dirty = True
            self._last_save = -RETRY_SAVE

    def poll_timeout(self) -> float:
        """Seconds the loop may block: until the nearest deadline (heartbeat, the map's idle
        heartbeat, a coalesced compute, a sweep, a failed save's retry, a replica still
        fetching its snapshot, the wait for the prober's map)."""
        now = self._clock()
        soon = now + SNAPSHOT_TIMEOUT  # an overdue sweep (inputs not usable yet) retries then
        deadlines = [now + self.ctx.heartbeat_interval, self.owner.next_tick(),
                     max(soon, self._last_full + FULL_SWEEP_PERIOD)]
        if self.engine.retired:
            deadlines.append(self._last_sweep + SWEEP_PERIOD)
        if self._changed and now - self._last_compute < COALESCE:
            # held back by the window; once it passed, inputs that are not usable yet (no
            # synced replicas, an old PLEG cache) are waited for, not polled in a busy loop
            deadlines.append(self._last_compute + COALESCE)
        if self._dirty:
            deadlines.append(self._last_save + RETRY_SAVE)
        if not all(r.synced for r in (self.desired, self.pleg, self.probes)):
            deadlines.append(soon)
        return max(0.0, min(deadlines) - now)

    def _log_inputs(self, changes: Changes) -> None:
        """``status.inputs`` once per pair of replica epochs: the first statuses computed by this
        incarnation, or after an upstream owner restarted (tests wait for it)."""
        by_pod: dict[str, list[Transition]] = {}
        for t in changes.transitions:
            by_pod.setdefault(t.uid, []).append(t)
        for uid, ts in by_pod.items():  # debug, as the kubelet logs status updates (V(3))
            self.ctx.log.debug("status.pod.conditions", pod_uid=uid,
                               new={t.type: t.new for t in ts},
                               old={t.type: t.old for t in ts}, at=ts[0].at)
        inputs = (self.desired.epoch, self.pleg.epoch)
        if inputs != self._inputs:
            self._inputs = inputs
            self.ctx.log.info("status.inputs", pid=os.getpid(), desired_epoch=inputs[0],
                              pleg_epoch=inputs[1], pods=len(self.engine.statuses),
                              changed=len(changes.set), deleted=len(changes.deleted))

    def _queue(self, changes: Changes) -> None:
        for uid, status in changes.set.items():
            self._pending_set[uid] = status
            self._pending_deleted.discard(uid)
        for uid in changes.deleted:
            self._pending_set.pop(uid, None)
            self._pending_deleted.add(uid)

    def commit(self) -> None:
        """Save the engine's statuses, then publish what was queued."""
        self.save()
        pending, self._pending_set = self._pending_set, {}
        deleted, self._pending_deleted = self._pending_deleted, set()
        for uid, value in pending.items():
            self.owner.set(uid, value)
        for uid in sorted(deleted):
            self.owner.delete(uid)

    def save(self) -> bool:
        self._last_save = self._clock()
        try:
            self.store.save(self.engine.saved())
        except OSError as err:
            self._dirty = True
            self.ctx.log.error("status.save_failed", path=str(self.store.path), error=str(err))
            return False
        self._dirty = False
        return True

    def turn(self, now: float) -> float:
        """The loop's step: compute and commit what is due; within ``COALESCE`` of a compute
        nothing can be computed, so replica traffic stays queued in zmq until the window ends
        (one drain per window in a burst, not a wake-up and a decode per update); snapshot
        requests and stop are still answered meanwhile."""
        self.step()
        self.loop.hold(self._last_compute + COALESCE)
        return self._clock() + self.poll_timeout()

    def run(self) -> None:
        self.loop.run(self.turn)

    def close(self) -> None:
        if self._pending_set or self._pending_deleted or self._dirty:
            self.commit()
        self.loop.close()
        self.store.close()
