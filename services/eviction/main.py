"""The supervised ``eviction`` process: composition only (service.py does the work)."""

from __future__ import annotations

import os

from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop
from podvisor.ipc.maps import DESIRED, PLEG, PRESSURE, DesiredPod, PlegPod
from podvisor.ipc.messages import NodeResourcesReclaimed
from podvisor.services.events import EventPublisher, Recorder
from podvisor.services.eviction.cgroups import detect_memory_cgroups
from podvisor.services.eviction.manager import EvictionManager
from podvisor.services.eviction.reclaim import node_reclaim_funcs
from podvisor.services.eviction.service import EventSink, EvictionService, Inputs
from podvisor.services.eviction.signals import NodeSources, mem_total
from podvisor.services.eviction.thresholds import parse_thresholds
from podvisor.services.eviction.usage import UsageReader


def run(ctx: ChildContext) -> None:
    cfg, clock = ctx.config, ctx.clock
    thresholds, problems = parse_thresholds(cfg.eviction_hard, cfg.eviction_soft,
                                            cfg.eviction_soft_grace_period,
                                            cfg.eviction_minimum_reclaim)
    for problem in problems:
        ctx.log.error("eviction.threshold_ignored", reason=problem)
    ctx.log.info("eviction.thresholds", thresholds=[t.describe() for t in thresholds])
    root = str(ctx.paths.root)
    cgroups = detect_memory_cgroups()
    ctx.log.info("eviction.cgroups", version=cgroups.version, mount=str(cgroups.mount))
    sources = NodeSources(cgroups, cgroups.folder(cfg.cgroup_root), mem_total, root,
                          lambda: root)  # images are kept under rootDir (embedded runtime)
    reader = UsageReader(cgroups, cfg.cgroup_root, ctx.paths.pods_dir, ctx.paths.pod_logs_dir)
    # the kubelet's HasDedicatedImageFs: the image filesystem is another device than rootDir's
    dedicated = os.stat(sources.imagefs() or root).st_dev != os.stat(root).st_dev
    recorder = Recorder(ctx.name, clock.wall)
    events = EventPublisher(ctx.zctx, ctx.paths, ctx.name, clock=clock)
    loop = ServiceLoop(ctx)
    pub = loop.publisher()
    pressure = loop.owner(pub, PRESSURE)
    desired = loop.replica(DESIRED)
    pleg = loop.replica(PLEG)
    service = EvictionService(
        EvictionManager(thresholds, cfg.eviction_pressure_transition_period,
                        cfg.eviction_max_pod_grace_period, node_reclaim_funcs(dedicated)),
        Inputs(sources.observe,
               lambda: {k: v for k, v in desired.items().items() if isinstance(v, DesiredPod)},
               lambda: {k: v for k, v in pleg.items().items() if isinstance(v, PlegPod)},
               reader.read, clock.wall),
        pressure, pub, ctx.log, cfg.eviction_monitoring_period,
        EventSink(recorder.record, lambda: recorder.flush(events)), cfg.node_name)

    def on_bus() -> None:
        while (env := answers.recv(0)) is not None:
            if isinstance(env.message, NodeResourcesReclaimed):
                service.answered(env.message)  # the next turn's step finishes the pass

    answers = loop.subscriber([NodeResourcesReclaimed.TOPIC], on_bus)

    def step(now: float) -> float | None:
        events.pump()
        # Wait for the maps' first snapshots: without them no pod is known.
        if not (pleg.synced and desired.synced):
            return now + 0.5
        return service.step(now)

    try:
        loop.run(step)
    finally:
        events.close()
        loop.close()

