"""Process ``status-api``: the status subsystem's API writer (runs when ``kubeconfig`` is set).

The main thread (the service loop) replicates ``desired``, ``statuses`` and the API source's
``pods-api`` map and hands a snapshot of them to a writer thread after every change; the
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

import threading

from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop
from podvisor.ipc.maps import API_MIRRORS, DESIRED, MIRRORS_KEY, POD_SET_KEY, STATUSES, pods_map
from podvisor.services.apiserver import ApiConnection, ApiUnreachable
from podvisor.services.status.apiwriter import Snapshot, StatusWriter

INITIAL_DELAY = 0.8
STALL_LIMIT = 120.0


class _Handoff:
    """The latest snapshot from the main thread to the writer (newest wins)."""

    def __init__(self, now: float) -> None:
        self.cond = threading.Condition()
        self.snapshot: Snapshot | None = None
        self.fresh = False
        self.progress = now

    def put(self, snap: Snapshot) -> None:
        with self.cond:
            self.snapshot, self.fresh = snap, True
            self.cond.notify()

    def take(self, timeout: float) -> Snapshot | None:
        with self.cond:
            if not self.fresh:
                self.cond.wait(timeout)
            self.fresh = False
            return self.snapshot


def run(ctx: ChildContext) -> None:
    config = ctx.config
    if not config.kubeconfig:
        ctx.log.info("status.api.disabled", reason="kubeconfig is not set")
        return
    conn = ApiConnection(config.kubeconfig)
    writer = StatusWriter(conn, config.node_name, ctx.log)
    handoff = _Handoff(ctx.clock.monotonic())
    stop = threading.Event()
    failure: list[BaseException] = []

    def helper() -> None:
        try:
            _write_loop(ctx, writer, handoff, stop)
        except BaseException as exc:  # re-raised on the main thread
            failure.append(exc)

    changed = [True]

    def on_change(key: str, old: object, new: object) -> None:
        changed[0] = True

    loop = ServiceLoop(ctx)
    loop.closing(conn)
    desired = loop.replica(DESIRED, on_change, snapshot_timeout=0.5)
    statuses = loop.replica(STATUSES, on_change, snapshot_timeout=0.5)
    api = loop.replica(pods_map("api"), on_change, snapshot_timeout=0.5)
    api_mirrors = loop.replica(API_MIRRORS, on_change, snapshot_timeout=0.5)
    thread = threading.Thread(target=helper, name="status-api", daemon=True)
    thread.start()

    def step(now: float) -> float | None:
        if failure:
            raise failure[0]
        if now - handoff.progress > STALL_LIMIT:
            raise RuntimeError(f"the API writer made no progress for {STALL_LIMIT}s")
        if changed[0] and desired.synced and statuses.synced:
            changed[0] = False
            mirrors = api_mirrors.get(MIRRORS_KEY) if api_mirrors.synced else None
            api_set = api.get(POD_SET_KEY) if api.synced else None
            handoff.put(Snapshot(desired.items(), statuses.items(),
                                 mirrors.mirrors if mirrors is not None else None,
                                 api_set.pods if api_set is not None else None))
        return None

    try:
        loop.run(step)
    finally:
        stop.set()
        with handoff.cond:
            handoff.cond.notify()
        thread.join(2)
        loop.close()


def _write_loop(ctx: ChildContext, writer: StatusWriter, handoff: _Handoff,
                stop: threading.Event) -> None:
    config = ctx.config
    delay = INITIAL_DELAY
    failing = ""
    snap: Snapshot | None = None
    while not stop.is_set():
        handoff.progress = ctx.clock.monotonic()
        newer = handoff.take(config.status_sweep_frequency if not failing else delay)
        snap = newer or snap
        if stop.is_set() or snap is None:
            continue
        try:
            writer.turn(snap)
        except ApiUnreachable as exc:
            if not failing:
                ctx.log.warning("status.api.unreachable", server=writer.conn.host,
                                reason=str(exc), pending=writer.pending(snap))
            failing = str(exc)
            stop.wait(delay)
            delay = min(delay * 2, config.api_retry_max_delay)
            with handoff.cond:
                handoff.fresh = True  # try again with the newest snapshot
            continue
        if failing:
            ctx.log.info("status.api.recovered", server=writer.conn.host)
            failing = ""
        delay = INITIAL_DELAY
