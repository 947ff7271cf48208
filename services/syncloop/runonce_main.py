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
from pathlib import Path
from typing import Any

from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop
from podvisor.ipc.maps import POD_SET_KEY, PodSetValue, pods_map
from podvisor.services.events import EventingLog, EventPublisher, Recorder
from podvisor.services.pod import Pod
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


def _write(path: Path, results: list[PodResult]) -> None:
    tmp = path.with_suffix(".tmp")
    rows = [{**r.to_dict(), "line": r.line()} for r in results]
    tmp.write_text(json.dumps({"results": rows}, indent=2), encoding="utf-8")
    os.replace(tmp, path)


class RunOnceService:
    """The runonce process, built once: the loop's thread waits for the sources' first sets
    (``step``), then the loop's worker runs every pod (``run_pods``) while the loop heartbeats
    and sends events; the loop ends with the results (or at a stop before the run began)."""

    def __init__(self, ctx: ChildContext) -> None:
        cfg = ctx.config
        self.ctx = ctx
        self.sources = _sources(ctx)
        self.loop = ServiceLoop(ctx)
        self.replicas = {s: self.loop.replica(pods_map(s)) for s in self.sources}
        self.events = Recorder(ctx.name, ctx.clock.wall)
        self.event_pub = EventPublisher(ctx.zctx, ctx.paths, ctx.name, clock=ctx.clock)
        self.loop.closing(self.event_pub)
        self.deps = new_sync_deps(ctx, EventingLog(ctx.log, self.events), shared=False)
        self.loop.closing(self.deps.cri)
        self.policy = RetryPolicy(tries=cfg.run_once_max_retries, delay=cfg.run_once_retry_delay)
        self.runner = self.loop.worker(self._run_pods, stall=None, name="runonce",
                                       deliver=self._finished)
        self.deadline = ctx.clock.monotonic() + SOURCES_WAIT
        self.sets: dict[str, dict[str, Any]] = {}
        self.pods: list[Pod] | None = None  # the plan, once every set is in (or the wait ended)
        self.known: list[PodResult] = []
        self.results: list[PodResult] | None = None

    def run(self) -> list[PodResult] | None:
        """Every pod's result, or None when stopped before the run began."""
        self.ctx.log.info("runonce.started", sources=self.sources)
        self.loop.run(self.step, done=lambda: self.results is not None or (
            self.pods is None and self.ctx.stop.is_set()))
        self.events.flush(self.event_pub)
        return self.results

    def step(self, now: float) -> float | None:
        if self.pods is None:
            return self._collect(now)
        if self.ctx.stop.is_set():
            self.loop.ignore_stop()  # the run ends by itself: its waits end at the stop
        self.events.flush(self.event_pub)
        return None

    def _collect(self, now: float) -> float | None:
        """Each source's first set, waiting up to ``SOURCES_WAIT``; then the plan, for the
        worker. A source missing by then sent none in time."""
        for source, replica in self.replicas.items():
            value = replica.get(POD_SET_KEY)
            if isinstance(value, PodSetValue):
                self.sets[source] = {"pods": value.pods, "errors": value.errors}
        if len(self.sets) < len(self.replicas) and now < self.deadline:
            return min(self.deadline, now + 0.5)
        self.pods, self.known = plan(self.sets)
        self.known += [PodResult(f"source {s}", False, FAILED,
                                 f"sent no pod set within {SOURCES_WAIT:g}s")
                       for s in self.sources if s not in self.sets]
        self.ctx.log.info("runonce.pods", pods=[p.full_name for p in self.pods],
                          known=len(self.known))
        self.runner.wake()
        return None

    def _run_pods(self, now: float) -> None:
        """The runner's one step (worker thread), once the plan is there."""
        if self.pods is not None and self.results is None:
            self.runner.put(run_pods(self.deps, self.pods, self.policy, self.ctx.stop.wait))
        return None

    def _finished(self, results: list[PodResult]) -> None:
        self.results = results + self.known

    def close(self) -> None:
        self.loop.close()


def run(ctx: ChildContext) -> None:
    service = RunOnceService(ctx)
    try:
        results = service.run()
    finally:
        service.close()
    if results is None or ctx.stop.is_set():
        return  # the agent is stopping: the supervisor reports the run as interrupted
    _write(ctx.paths.runonce_results, results)
    ctx.log.info("runonce.done", pods=len(results), failed=sum(not r.ok for r in results))
