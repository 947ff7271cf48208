"""The supervised ``eviction`` process: composition only (service.py does the work)."""

from __future__ import annotations

from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop
from podvisor.ipc.maps import DESIRED, PLEG, PRESSURE, DesiredPod, PlegPod
from podvisor.services.eviction.manager import EvictionManager
from podvisor.services.eviction.service import EvictionService, Inputs
from podvisor.services.eviction.signals import (
    MEMORY_CGROUP_MOUNT,
    NodeSources,
    mem_total,
    memory_folder,
)
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
    sources = NodeSources(memory_folder(cfg.cgroup_root), mem_total, root,
                          lambda: root)  # images are kept under rootDir (embedded runtime)
    reader = UsageReader(MEMORY_CGROUP_MOUNT, cfg.cgroup_root, ctx.paths.pods_dir,
                         ctx.paths.pod_logs_dir)
    loop = ServiceLoop(ctx)
    pub = loop.publisher()
    pressure = loop.owner(pub, PRESSURE)
    desired = loop.replica(DESIRED)
    pleg = loop.replica(PLEG)
    service = EvictionService(
        EvictionManager(thresholds, cfg.eviction_pressure_transition_period,
                        cfg.eviction_max_pod_grace_period),
        Inputs(sources.observe,
               lambda: {k: v for k, v in desired.items().items() if isinstance(v, DesiredPod)},
               lambda: {k: v for k, v in pleg.items().items() if isinstance(v, PlegPod)},
               reader.read, clock.wall),
        pressure, pub, ctx.log, cfg.eviction_monitoring_period)

    def step(now: float) -> float | None:
        # Wait for the maps' first snapshots: without them no pod is known.
        if not (pleg.synced and desired.synced):
            return now + 0.5
        return service.step(now)

    try:
        loop.run(step)
    finally:
        loop.close()

