"""The ``runonce`` process (``runOnce: true`` / ``podvisor run --runonce``): RunOnce's driver.

The supervisor runs it in place of the sync loop, beside only the runtime (embedded) and the
pod sources, all supervised as usual. It takes each configured source's first set from the
source's replicated map (``pods-file``, ``pods-http``: the same sets the sync loop merges),
plans (``runonce.plan``: merge, admission), runs every pod until its containers run
(``runonce.run_pods``, SyncPod with retries), writes the results to ``run/runonce.json``
and returns; the supervisor then prints them and exits. Restarted after a crash, it starts over:
SyncPod adopts what already runs, so nothing starts twice. A source that sends no set within
``SOURCES_WAIT`` is reported as failed.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop
from podvisor.ipc.maps import POD_SET_KEY, PodSetValue, pods_map
from podvisor.services.events import EventingLog, EventPublisher, Recorder
from podvisor.services.syncloop.main import new_sync_deps
from podvisor.services.syncloop.runonce import FAILED, PodResult, RetryPolicy, plan, run_pods

SOURCES_WAIT = 60.0


def _sources(ctx: ChildContext) -> list[str]:
    out = []
    if ctx.config.static_pod_path:
        out.append("file")
    if ctx.config.static_pod_url:
        out.append("http")
    return out


def _first_sets(ctx: ChildContext, sources: list[str]) -> dict[str, dict[str, Any]]:
    """Each source's first set, waiting (heartbeating) up to ``SOURCES_WAIT``; a source missing
    from the answer sent none in time."""
    loop = ServiceLoop(ctx)
    replicas = {s: loop.replica(pods_map(s)) for s in sources}
    deadline = ctx.clock.monotonic() + SOURCES_WAIT
    sets: dict[str, dict[str, Any]] = {}

    def step(now: float) -> float:
        for source, replica in replicas.items():
            value = replica.get(POD_SET_KEY)
            if isinstance(value, PodSetValue):
                sets[source] = {"pods": value.pods, "errors": value.errors}
        return min(deadline, now + 0.5)

    try:
        loop.run(step, done=lambda: (ctx.stop.is_set() or len(sets) == len(replicas)
                                     or ctx.clock.monotonic() >= deadline))
    finally:
        loop.close()
    return sets


def _write(path: Path, results: list[PodResult]) -> None:
    tmp = path.with_suffix(".tmp")
    rows = [{**r.to_dict(), "line": r.line()} for r in results]
    tmp.write_text(json.dumps({"results": rows}, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def _in_thread(ctx: ChildContext, fn: Callable[[], list[PodResult]],
               flush: Callable[[], object]) -> list[PodResult]:
    """Run ``fn`` on a thread while this (main) thread heartbeats and flushes events."""
    out: list[list[PodResult]] = []
    worker = threading.Thread(target=lambda: out.append(fn()), name="runonce", daemon=True)
    worker.start()
    while worker.is_alive():
        ctx.heartbeat()
        flush()
        worker.join(ctx.heartbeat_interval)
    flush()
    if not out:
        raise RuntimeError("the RunOnce thread ended without results")
    return out[0]


def run(ctx: ChildContext) -> None:
    cfg = ctx.config
    sources = _sources(ctx)
    ctx.log.info("runonce.started", sources=sources)
    sets = _first_sets(ctx, sources)
    if ctx.stop.is_set():
        return
    pods, known = plan(sets)
    known += [PodResult(f"source {s}", False, FAILED, f"sent no pod set within {SOURCES_WAIT:g}s")
              for s in sources if s not in sets]
    events = Recorder(ctx.name, ctx.clock.wall)
    event_pub = EventPublisher(ctx.zctx, ctx.paths, ctx.name, clock=ctx.clock)
    deps = new_sync_deps(ctx, EventingLog(ctx.log, events), shared=False)
    policy = RetryPolicy(tries=cfg.run_once_max_retries, delay=cfg.run_once_retry_delay)
    ctx.log.info("runonce.pods", pods=[p.full_name for p in pods], known=len(known))
    try:
        results = _in_thread(ctx, lambda: run_pods(deps, pods, policy, ctx.stop.wait),
                             lambda: events.flush(event_pub))
    finally:
        deps.cri.close()
        event_pub.close()
    if ctx.stop.is_set():
        return  # the agent is stopping: the supervisor reports the run as interrupted
    results += known
    _write(ctx.paths.runonce_results, results)
    ctx.log.info("runonce.done", pods=len(results), failed=sum(not r.ok for r in results))
