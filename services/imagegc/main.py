"""The supervised ``imagegc`` process: composition only (service.py does the work)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import cast

from podvisor.common.child import ChildContext
from podvisor.common.endpoint import cri_endpoint, is_embedded
from podvisor.common.service import ServiceLoop
from podvisor.ipc.maps import DESIRED, PLEG, DesiredPod
from podvisor.ipc.messages import ReclaimNodeResources
from podvisor.services.cri import OnDemandRuntimeClient, RuntimeClient, new_runtime_client
from podvisor.services.events import EventPublisher, Recorder
from podvisor.services.imagegc.gc import owned_by
from podvisor.services.imagegc.logrotate import STAMP
from podvisor.services.imagegc.service import EventSink, ImageGC, usage_source


def run(ctx: ChildContext) -> None:
    import os

    cfg, clock = ctx.config, ctx.clock
    endpoint = cri_endpoint(cfg.runtime_endpoint, ctx.paths.cri_socket, cfg.cri_proxy)
    # connected during the passes only: an open channel costs grpcio's threads' wake-ups
    on_demand = OnDemandRuntimeClient(
        lambda: new_runtime_client(endpoint, timeout=min(cfg.runtime_request_timeout, 60.0)))
    cri = cast(RuntimeClient, on_demand)
    recorder = Recorder(ctx.name, clock.wall)
    publisher = EventPublisher(ctx.zctx, ctx.paths, ctx.name, clock=clock)
    loop = ServiceLoop(ctx)
    pleg = loop.replica(PLEG)
    desired = loop.replica(DESIRED)
    pub = loop.publisher()
    gc = ImageGC(cri, usage_source(cri, os.environ), ctx.log,
                 EventSink(recorder.record, lambda: recorder.flush(publisher)), cfg.node_name,
                 cfg.image_gc_high_threshold_percent, cfg.image_gc_low_threshold_percent,
                 cfg.image_minimum_gc_age, ctx.paths.state_dir / "imagegc.prom",
                 # the embedded runtime holds this agent's pods only; another runtime may
                 # hold other clients' pods: only the pods this rootDir's agent made
                 (lambda _uid: True) if is_embedded(cfg.runtime_endpoint)
                 else owned_by(ctx.paths.pod_logs_dir))
    gc.log_limits = (cfg.container_log_max_size, cfg.container_log_max_files)
    gc.stamp = lambda: time.strftime(STAMP, time.gmtime(clock.wall()))

    def on_bus() -> None:
        """The eviction manager's ``ReclaimNodeResources``: reclaim now, answer (a request
        before the maps' first snapshots waits: it is published again)."""
        while (env := sub.recv(0)) is not None:
            request = env.message
            if not isinstance(request, ReclaimNodeResources) or not (pleg.synced
                                                                      and desired.synced):
                continue
            pods = desired.items()
            # pods the sync loop never starts anything of again: failed for good (evicted,
            # past their deadline, a node shutdown's). A Succeeded pod's dead containers stay:
            # their history is what tells the sync loop not to run them again
            terminated = {uid for uid, d in pods.items() if isinstance(d, DesiredPod)
                          and (d.failed or d.worker == "terminated")}
            try:
                answer = gc.reclaim(clock.monotonic(), request, pleg.items(), set(pods),
                                    terminated)
            finally:
                on_demand.release()
            pub.publish(replace(answer, ts=clock.wall()))

    sub = loop.subscriber([ReclaimNodeResources.TOPIC], on_bus)

    def step(now: float) -> float | None:
        publisher.pump()
        # Wait for the maps' first snapshots: without them every pod looks removed.
        if not (pleg.synced and desired.synced):
            return now + 0.5
        try:
            return min(gc.step(now, pleg.items(), set(desired.items())), now + 1.0)
        finally:
            on_demand.release()

    try:
        loop.run(step)
    finally:
        publisher.close()
        loop.close()
        cri.close()
