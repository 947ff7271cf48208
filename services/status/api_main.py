"""Process ``status-api``: the status subsystem's API writer (runs when ``kubeconfig`` is set).

The service loop's thread replicates ``desired``, ``statuses`` and the API source's
``pods-api`` and ``api-mirrors`` maps and hands a snapshot of them to the loop's worker after
every change; the writer (``apiwriter.py``) PATCHes statuses whose version advanced, keeps
mirror pods and deletes terminated API pods. A reflector (list+watch of this node's pods,
status kept: ``apicopy.ApiCopies``) keeps the API's copy of every status; every
``statusSweepFrequency`` the turn is a reconcile turn (the kubelet's ``syncBatch(all)``): a
pod whose copy differs from podvisor's status is written again, whoever changed it.

When the API server is unreachable the writer backs off (0.8 s doubling to
``apiRetryMaxDelay``, at most ``statusSweepFrequency``: the kubelet's status manager tries
every 10 s); nothing is lost meanwhile: the pending work is "every status newer than what was
written", recomputed from the latest snapshot. Nothing waits on a turn an old error ended:
when the reflector lists again (the server is back, or its versions expired) the back-off is
dropped, the writer forgets what held only while the server was away (``StatusWriter.back``)
and a reconcile turn runs at once; when a write succeeds after a failure, the reflector's own
back-off is cut short (``Reflector.retry``). The reflector backs off at most
``statusSweepFrequency`` too, so the copies are fresh within one sweep of the server's return.

A separate process from ``status`` on purpose: a slow or absent API server never delays the
statuses the rest of the agent reads, and a kill -9 of either leaves the other alone. Stateless:
after a restart every status is written once more (a PATCH of an equal status changes nothing)
and the reflector lists.
"""

from __future__ import annotations

import math
import threading

from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop, Worker
from podvisor.ipc.maps import API_MIRRORS, DESIRED, MIRRORS_KEY, POD_SET_KEY, STATUSES, pods_map
from podvisor.services.apiserver import ApiConnection, ApiUnreachable, Reflector
from podvisor.services.status.apicopy import ApiCopies
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
    snapshot to the writer (the loop's worker, ``write``) after every change; the reflector's
    thread keeps the API's copies and wakes the writer after every list."""

    def __init__(self, ctx: ChildContext, initial_delay: float = INITIAL_DELAY) -> None:
        config = ctx.config
        self.ctx = ctx
        self.initial_delay = initial_delay  # the writer's first back-off (then doubling)
        self.conn = ApiConnection(config.kubeconfig, "status-api")
        self.sweep = config.status_sweep_frequency
        self.max_delay = min(config.api_retry_max_delay, self.sweep)
        self.handoff = _Handoff()
        self.changed = True
        self.delay = initial_delay
        self.failing = ""
        self.retry_at = -math.inf  # backing off: no turn before this, new snapshots or not
        self.next_sweep = -math.inf  # the next reconcile turn
        self.lists = 0  # the copies' lists the writer has seen
        self.loop = ServiceLoop(ctx)
        self.loop.closing(self.conn)
        self.loop.on_faults(self.conn.faults.set)  # injected api faults (issue 28)
        self.worker: Worker[None] = self.loop.worker(self.write, stall=STALL_LIMIT,
                                                     name="status-api")
        self.copies = ApiCopies(self.worker.wake)
        self.reflector = Reflector(self.conn, "/api/v1/pods",
                                   {"fieldSelector": f"spec.nodeName={config.node_name}"},
                                   self.copies, watch_timeout=config.api_watch_timeout,
                                   max_delay=self.max_delay)
        self.writer = StatusWriter(self.conn, config.node_name, ctx.log, copies=self.copies)
        self.desired = self.loop.replica(DESIRED, self.on_change, snapshot_timeout=0.5)
        self.statuses = self.loop.replica(STATUSES, self.on_change, snapshot_timeout=0.5)
        self.api = self.loop.replica(pods_map("api"), self.on_change, snapshot_timeout=0.5)
        self.api_mirrors = self.loop.replica(API_MIRRORS, self.on_change, snapshot_timeout=0.5)

    def run(self) -> None:
        self.reflector.start()
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
        """One turn of the writer on the newest snapshot (worker thread): when a new snapshot
        or list comes, and a reconcile turn every ``statusSweepFrequency`` and after every
        list (a back-off while the server is unreachable, dropped by a list)."""
        lists = self.copies.lists
        if lists != self.lists:  # listed: the server answers, every copy is fresh
            self.lists = lists
            self.back()
        if now < self.retry_at:
            return self.retry_at
        snap = self.handoff.take()
        if snap is None:
            return None
        reconcile = now >= self.next_sweep
        try:
            self.writer.turn(snap, reconcile=reconcile)
        except ApiUnreachable as exc:
            if not self.failing:
                self.ctx.log.warning("status.api.unreachable", server=self.writer.conn.host,
                                     reason=str(exc), pending=self.writer.pending(snap))
            self.failing = str(exc)
            wait, self.delay = self.delay, min(self.delay * 2, self.max_delay)
            self.retry_at = self.ctx.clock.monotonic() + wait
            return self.retry_at  # then again with the newest snapshot
        if self.failing:
            self.ctx.log.info("status.api.recovered", server=self.writer.conn.host)
            self.failing = ""
            self.reflector.retry()  # its copies are as old as the outage: list now
        self.delay = self.initial_delay
        if reconcile:
            self.next_sweep = now + self.sweep
        return self.next_sweep

    def back(self) -> None:
        """After a list (worker thread): no back-off, nothing waiting on the outage, a
        reconcile turn now."""
        if self.failing or self.lists > 1:
            self.ctx.log.info("status.api.relisted", server=self.writer.conn.host,
                              pods=len(self.copies), lists=self.lists)
        self.retry_at = -math.inf
        self.delay = self.initial_delay
        self.next_sweep = -math.inf
        self.writer.back()

    def close(self) -> None:
        self.reflector.stop()
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
