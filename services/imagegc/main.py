"""The supervised ``imagegc`` process: composition only (service.py does the work)."""

from __future__ import annotations

import os
import time

from podvisor.ipc.clone import MapReplica
from podvisor.services.cri import new_runtime_client
from podvisor.services.events.publisher import EventPublisher
from podvisor.services.events.recorder import Recorder
from podvisor.services.imagegc.gc import owned_by
from podvisor.services.imagegc.logrotate import STAMP
from podvisor.services.imagegc.service import EventSink, ImageGC, usage_source
from podvisor.supervisor.child import ChildContext


def run(ctx: ChildContext) -> None:
    cfg = ctx.config
    ep: str = cfg.runtime_endpoint
    endpoint = f"unix://{ctx.paths.cri_socket}" if ep == "embedded" else ep
    cri = new_runtime_client(endpoint, timeout=min(cfg.runtime_request_timeout, 60.0))
    recorder = Recorder(ctx.name)
    publisher = EventPublisher(ctx.zctx, ctx.paths, ctx.name)
    pleg = MapReplica(ctx.zctx, ctx.paths, "pleg")
    desired = MapReplica(ctx.zctx, ctx.paths, "desired")
    gc = ImageGC(cri, usage_source(cri, os.environ), ctx.log,
                 EventSink(recorder.record, lambda: recorder.flush(publisher)), cfg.node_name,
                 cfg.image_gc_high_threshold_percent, cfg.image_gc_low_threshold_percent,
                 cfg.image_minimum_gc_age, ctx.paths.state_dir / "imagegc.prom",
                 # the embedded runtime holds this agent's pods only; another runtime may
                 # hold other clients' pods: only the pods this rootDir's agent made
                 (lambda _uid: True) if ep == "embedded" else owned_by(ctx.paths.pod_logs_dir))
    gc.log_limits = (cfg.container_log_max_size, cfg.container_log_max_files)
    gc.stamp = lambda: time.strftime(STAMP, time.gmtime())
    every = float(ctx.config.supervision.heartbeat_interval)
    try:
        while not ctx.stop.is_set():
            ctx.heartbeat()
            pleg.pump(0)
            desired.pump(0)
            publisher.pump()
            now = time.monotonic()
            # Wait for the maps' first snapshots: without them every pod looks removed.
            if pleg.synced and desired.synced:
                gc.step(now, pleg.items(), set(desired.items()))
            ctx.stop.wait(min(every, 1.0))
    finally:
        publisher.close()
        pleg.close()
        desired.close()
        cri.close()
