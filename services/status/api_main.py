"""Process ``status-api``: the status subsystem's API writer (runs when ``kubeconfig`` is set).

The service loop's thread replicates ``desired``, ``statuses`` and the API source's
``pods-api`` map and hands a snapshot of them to the loop's worker after every change; the
writer (``apiwriter.py``) PATCHes statuses whose version advanced, keeps mirror pods and
deletes terminated API pods, and does a turn every ``statusSweepFrequency`` anyway (what
failed is retried then). When the API server is unreachable the writer backs off (0.8 s
doubling to ``apiRetryMaxDelay``); nothing is lost meanwhile: the pending work is "every
status newer than what was written", recomputed from the latest snapshot, so each pod's newest
status reaches the API once it is back.

A separate process from ``status`` on purpose: a slow or absent API server never delays the
statuses the rest of the agent reads, and a kill -9 of either leaves the other alone. Stateless:
after a restart every status is written once more (a PATCH of an equal status changes nothing).
"""

from __future__ import annotations

import math
import threading

from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop, Worker
from podvisor.ipc.maps import API_MIRRORS, DESIRED, MIRRORS_KEY, POD_SET_KEY, STATUSES, pods_map
from podvisor.services.apiserver import ApiConnection, ApiUnreachable
from podvisor.services.status.apiwriter import Snapshot, StatusWriter

INITIAL_DELAY = 0.8
STALL_LIMIT = 120.0


class _Handoff:
    """The latest snapshot from the loop's thread to the writer (newest wins)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.snapshot: Snapshot | None = None

    def put(self, snap: Snapshot) -> None:
        with self.lock:
            self.snapshot = snap

    def take(self) -> Snapshot | None:
        with self.lock:
            return self.snapshot


class StatusApiService:
    """The status-api process, built once: the loop's thread replicates the maps and hands a
    snapshot to the writer (the loop's worker, ``write``) after every change."""

    def __init__(self, ctx: ChildContext) -> None:
        config = ctx.config
        self.ctx = ctx
        self.conn = ApiConnection(config.kubeconfig)
        self.writer = StatusWriter(self.conn, config.node_name, ctx.log)
        self.handoff = _Handoff()
        self.changed = True
        self.delay = INITIAL_DELAY
        self.failing = ""
        self.retry_at = -math.inf  # backing off: no turn before this, new snapshots or not
        self.loop = ServiceLoop(ctx)
        self.loop.closing(self.conn)
        self.loop.on_faults(self.conn.faults.set)  # injected api faults (issue 28)
        self.desired = self.loop.replica(DESIRED, self.on_change, snapshot_timeout=0.5)
        self.statuses = self.loop.replica(STATUSES, self.on_change, snapshot_timeout=0.5)
        self.api = self.loop.replica(pods_map("api"), self.on_change, snapshot_timeout=0.5)
        self.api_mirrors = self.loop.replica(API_MIRRORS, self.on_change, snapshot_timeout=0.5)
        self.worker: Worker[None] = self.loop.worker(self.write, stall=STALL_LIMIT,
                                                     name="status-api")

    def run(self) -> None:
        self.loop.run(self.step)

    def on_change(self, key: str, old: object, new: object) -> None:
        self.changed = True

    def step(self, now: float) -> float | None:
        """A new snapshot for the writer after a change (loop thread)."""
        desired, statuses, api, api_mirrors = (self.desired, self.statuses, self.api,
                                               self.api_mirrors)
        if self.changed and desired.synced and statuses.synced:
            self.changed = False
            mirrors = api_mirrors.get(MIRRORS_KEY) if api_mirrors.synced else None
            api_set = api.get(POD_SET_KEY) if api.synced else None
            self.handoff.put(Snapshot(desired.items(), statuses.items(),
                                      mirrors.mirrors if mirrors is not None else None,
                                      api_set.pods if api_set is not None else None))
            self.worker.wake()
        return None

    def write(self, now: float) -> float | None:
        """One turn of the writer on the newest snapshot (worker thread); the next when a new
        snapshot comes, or after ``statusSweepFrequency`` (a back-off while the server is
        unreachable)."""
        config = self.ctx.config
        if now < self.retry_at:
            return self.retry_at
        snap = self.handoff.take()
        if snap is None:
            return None
        try:
            self.writer.turn(snap)
        except ApiUnreachable as exc:
            if not self.failing:
                self.ctx.log.warning("status.api.unreachable", server=self.writer.conn.host,
                                     reason=str(exc), pending=self.writer.pending(snap))
            self.failing = str(exc)
            wait, self.delay = self.delay, min(self.delay * 2, config.api_retry_max_delay)
            self.retry_at = self.ctx.clock.monotonic() + wait
            return self.retry_at  # then again with the newest snapshot
        if self.failing:
            self.ctx.log.info("status.api.recovered", server=self.writer.conn.host)
            self.failing = ""
        self.delay = INITIAL_DELAY
        return self.ctx.clock.monotonic() + config.status_sweep_frequency

    def close(self) -> None:
        self.loop.close()


def run(ctx: ChildContext) -> None:
    if not ctx.config.kubeconfig:
        ctx.log.info("status.api.disabled", reason="kubeconfig is not set")
        return
    service = StatusApiService(ctx)
    try:
        service.run()
    finally:
        service.close()
