"""The syncloop process: ``run(ctx)`` wires the bus, CRI and the ``desired`` map to ``SyncLoop``.

One poll loop over: pod sets (the replicated maps ``pods-file`` / ``pods-http`` that the source
processes own, so a restarted sync loop has every set from a snapshot at once), PLEG events
(``pleg.pod.event``, which trigger the pod's worker at once), the sync loop's own container
event stream (``runtime_events``: a stop syncs the pod at once, from the event's state when
safe; the step runs right after, before the other inputs), stop-all requests
(``syncloop.pods.stopall``), snapshot requests on the ``desired`` map's ROUTER, and a wake pipe
the worker threads write when work finishes; the poll timeout is the next due pod, housekeeping
(2 s) or at most 1 s (the tick).

SIGTERM: with ``stopPodsOnExit`` every pod is terminated (within its grace) before exiting;
otherwise the process exits at once and pods keep running (a restarted sync loop adopts them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from podvisor.common import crashpoints
from podvisor.common.child import ChildContext
from podvisor.common.endpoint import cri_endpoint
from podvisor.common.pool import ElasticPool
from podvisor.common.service import ServiceLoop, WakePipe
from podvisor.ipc.bus import Publisher
from podvisor.ipc.clone import MapOwner, MapReplica
from podvisor.ipc.codec import Envelope
from podvisor.ipc.maps import DESIRED, POD_SET_KEY, PROBES, PodProbes, PodSetValue, pods_map
from podvisor.ipc.messages import AllPodsStopped, RelistHint
from podvisor.services.apiserver import ApiConnection
from podvisor.services.cri import new_instrumented_client, new_runtime_client
from podvisor.services.events import EventingLog, EventPublisher, Recorder
from podvisor.services.prober import failed_probes, liveness_failed
from podvisor.services.syncloop.apiobjects import ApiObjects
from podvisor.services.syncloop.backoff import BackoffPolicy, CrashBackoff, SharedBackoff
from podvisor.services.syncloop.cgroupfs import new_cgroup_fs
from podvisor.services.syncloop.loop import LoopDeps, SyncLoop
from podvisor.services.syncloop.metrics import WorkerMetrics
from podvisor.services.syncloop.network import NetworkState
from podvisor.services.syncloop.node import admission_capacity, discover_node_facts
from podvisor.services.syncloop.podcache import ImagePresence, RuntimeCache
from podvisor.services.syncloop.podcgroups import new_pod_cgroups
from podvisor.services.syncloop.podconfig import new_pod_config
from podvisor.services.syncloop.runtime_events import (
    SeenStops,
    event_mono,
    is_stop,
    new_stop_watcher,
    pod_events,
)
from podvisor.services.syncloop.syncpod import SyncDeps
from podvisor.services.syncloop.terminate import Log
from podvisor.services.syncloop.workers import Timing, WorkerTable

TOPICS = ("pleg.pod.event", "syncloop.pods.stopall")
TICK = 1.0
SOURCES_WAIT = 10.0  # serve `desired` without a source's set after this long (source down)
POOL_THREADS = 128
IMAGE_BACKOFF = BackoffPolicy(initial=10.0, cap=300.0, reset_after=600.0)


def _sources(ctx: ChildContext) -> set[str]:
    out = set()
    if ctx.config.static_pod_path:
        out.add("file")
    if ctx.config.static_pod_url:
        out.add("http")
    if ctx.config.kubeconfig and not ctx.config.run_once:
        out.add("api")
    return out


def new_sync_deps(ctx: ChildContext, log: Log, shared: bool = True) -> SyncDeps:
    """What SyncPod needs, from the config (also RunOnce's, with ``shared`` off: no listing
    shared between workers and no image presence cache, every read fresh)."""
    cfg, clock = ctx.config, ctx.clock
    sl = cfg.syncloop
    policy = BackoffPolicy(sl.crash_loop_backoff_initial, sl.crash_loop_backoff_max,
                           sl.crash_loop_backoff_reset)
    # the kubelet's runtime operation metrics (multiprocess directory in the agent)
    registry = CollectorRegistry(auto_describe=False)
    cri = new_instrumented_client(
        new_runtime_client(cri_endpoint(cfg.runtime_endpoint, ctx.paths.cri_socket),
                           timeout=cfg.runtime_request_timeout),
        registry, clock.monotonic)
    started = Counter("kubelet_started_containers", "Cumulative number of containers started",
                      registry=registry)
    ctx.paths.pods_dir.mkdir(parents=True, exist_ok=True)
    ctx.paths.pod_logs_dir.mkdir(parents=True, exist_ok=True)
    cgroups = (new_pod_cgroups(cfg.cgroup_root, new_cgroup_fs(), log, cfg.pod_pids_limit)
               if cfg.cgroup_root
               else None)
    return SyncDeps(cri=cri, pods_dir=ctx.paths.pods_dir, pod_logs_dir=ctx.paths.pod_logs_dir,
                    backoff=SharedBackoff(CrashBackoff(policy)),
                    image_backoff=SharedBackoff(CrashBackoff(IMAGE_BACKOFF)),
                    mono=clock.monotonic, wall=clock.wall, sleep=time.sleep, log=log,
                    cgroups=cgroups, node=discover_node_facts(cfg.address, cfg.node_name),
                    cache=RuntimeCache(cri, clock.monotonic, clock.wall) if shared else None,
                    images=ImagePresence(cri, clock.monotonic) if shared else None,
                    network=NetworkState(), pull_slots=pull_slots(cfg),
                    objects=ApiObjects(
                        ApiConnection(cfg.kubeconfig), cfg.api_object_cache_ttl,
                        clock.monotonic, clock.wall,
                        strategy=cfg.config_map_and_secret_change_detection_strategy,
                        watch_timeout=cfg.api_watch_timeout, max_delay=cfg.api_retry_max_delay)
                    if cfg.kubeconfig else None,
                    started=started.inc, crash=crashpoints.from_env("syncloop"))


def pull_slots(cfg: Any) -> threading.Semaphore | None:
    """serializeImagePulls (default): one pull at a time; else maxParallelImagePulls at once
    (0: no limit)."""
    if cfg.serialize_image_pulls:
        return threading.Semaphore(1)
    n = int(cfg.max_parallel_image_pulls)
    return threading.Semaphore(n) if n > 0 else None


def build(ctx: ChildContext, service: ServiceLoop, publisher: Publisher,
          pool: Executor, wake: WakePipe, events: Recorder | None = None
          ) -> tuple[SyncLoop, MapOwner]:
    """The composition root: every part of the sync loop, from the config."""
    cfg = ctx.config
    log = EventingLog(ctx.log, events) if events is not None else ctx.log
    sync = new_sync_deps(ctx, log)
    owner = service.owner(publisher, DESIRED, serving=False)

    def submit(fn: Callable[[], None]) -> None:
        pool.submit(fn)

    table = WorkerTable(Timing(resync=cfg.sync_frequency))
    metrics = WorkerMetrics()  # multiprocess directory in the agent
    loop = SyncLoop(LoopDeps(sync=sync, pod_config=new_pod_config(_sources(ctx)), table=table,
                             desired=owner, submit=submit,
                             wake=wake.wake, node_name=cfg.node_name,
                             capacity=admission_capacity(sync.node, cfg)
                             if cfg.kubeconfig else None,
                             observe_work=metrics.observe_work, restarted=metrics.restarted))
    return loop, owner


def _resolver(loop: SyncLoop) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Fill an event's pod name, namespace and manifest file from the worker table."""

    def resolve(obj: dict[str, Any]) -> dict[str, Any]:
        w = loop.deps.table.get(str(obj.get("uid", "")))
        if w is not None and w.pod is not None:
            obj.setdefault("name", w.pod.metadata.name)
            obj.setdefault("namespace", w.pod.metadata.namespace)
            if w.pod.origin is not None and w.pod.origin.location:
                obj.setdefault("file", w.pod.origin.location)
        return obj
    return resolve


# PLEG events that sync no pod: a removal (as the kubelet's isSyncPodWorthy) and a start (the
# sync loop's own doing; the kubelet syncs anyway: one wasted sync per start, three CRI calls).
_UNWORTHY = frozenset({"ContainerRemoved", "ContainerStarted"})


def _worthy(kind: str, container_id: str, seen: SeenStops, streaming: bool) -> bool:
    """Whether a PLEG event syncs its pod. With the sync loop's own stream live, a death it
    reported is old news and ContainerChanged (a container seen CREATED: the sync loop's own
    create, between its CreateContainer and StartContainer) needs no sync either."""
    if kind in _UNWORTHY:
        return False
    if kind == "ContainerDied":
        return container_id not in seen
    return not (streaming and kind == "ContainerChanged")


def _dispatch(loop: SyncLoop, env: Envelope, now: float, seen: SeenStops,
              streaming: bool) -> bool:
    """Handle one bus message; True when it asks to stop every pod."""
    msg = env.message
    if env.type == "pleg.pod.event":
        if _worthy(str(getattr(msg, "type", "")), str(getattr(msg, "container_id", "")), seen,
                   streaming):
            ts = getattr(msg, "ts", None)
            loop.handle_pleg_event(str(getattr(msg, "pod_uid", "")), now,
                                   float(ts) if isinstance(ts, (int, float)) else None)
    elif env.type == "syncloop.pods.stopall":
        return True
    return False


def _source_replicas(ctx: ChildContext, service: ServiceLoop, loop: SyncLoop
                     ) -> list[MapReplica]:
    """One replica per configured source; each new set of a source goes to the merge."""

    def feeder(source: str) -> Callable[[str, object, object], None]:
        def on_change(key: str, old: object, new: object) -> None:
            if key == POD_SET_KEY and isinstance(new, PodSetValue):
                loop.handle_pod_set(source, list(new.pods), ctx.clock.monotonic())
        return on_change

    return [service.replica(pods_map(src), feeder(src), decode=PodSetValue.from_wire)
            for src in sorted(_sources(ctx))]


def _probes_replica(ctx: ChildContext, service: ServiceLoop, loop: SyncLoop) -> MapReplica:
    """The prober's ``probes`` map: a new liveness/startup failure syncs the pod at once (its
    container is killed and restarted per policy); syncs read the failed IDs."""
    failed: dict[str, dict[str, str]] = {}  # pod UID -> container ID -> the failed probe

    def on_change(key: str, old: PodProbes | None, new: PodProbes | None) -> None:
        probes = failed_probes(new)
        if probes:
            failed[key] = probes
        else:
            failed.pop(key, None)
        if set(probes) - liveness_failed(old):
            loop.handle_pleg_event(key, ctx.clock.monotonic())

    loop.deps.liveness_failed = lambda uid: failed.get(uid, {})
    return service.replica(PROBES, on_change, decode=PodProbes.from_wire)


class _Stopping:
    """Where a stop of every pod stands (``syncloop.pods.stopall`` or the process's stop)."""

    def __init__(self) -> None:
        self.active = False
        self.count = 0
        self.done = False  # the process may exit


def run(ctx: ChildContext) -> None:
    """Composition: build every part, declare what the loop watches, run it."""
    clock = ctx.clock
    service = ServiceLoop(ctx)
    publisher = service.publisher()
    pool = ElasticPool(max_workers=POOL_THREADS, thread_name_prefix="podworker")
    wake = WakePipe()
    events = Recorder(ctx.name, clock.wall)
    event_pub = EventPublisher(ctx.zctx, ctx.paths, ctx.name, clock=clock)
    loop, owner = build(ctx, service, publisher, pool, wake, events)
    events.resolve = _resolver(loop)
    replicas = _source_replicas(ctx, service, loop)
    _probes_replica(ctx, service, loop)
    stops, seen = new_stop_watcher(loop.deps.sync.cri, ctx.log), SeenStops()
    cache = loop.deps.sync.cache
    stopping = _Stopping()

    def stop_all(now: float) -> None:
        if not stopping.active:
            stopping.active, stopping.count = True, len(loop.deps.table.workers)
            loop.stop_all(now)

    def on_bus() -> None:
        while (env := subscriber.recv(0)) is not None:
            if _dispatch(loop, env, clock.monotonic(), seen, stops.streaming):
                stop_all(clock.monotonic())

    def on_runtime_events() -> None:
        now = clock.monotonic()
        items = stops.drain()
        if cache is not None:
            cache.changed()  # an event, a lost one or a stream mode change
            cache.watched(stops.streaming)
        for uid, event in pod_events(items):
            if is_stop(event):
                seen.add(event.container_id)
            loop.handle_container_event(uid, event, now, event_mono(event, now, clock.wall()))
        loop.step(now)  # hand a restart out before reading the other inputs

    # Like PLEG's relist-before-serve: no `desired` snapshot until every source's set is in, so
    # a restarted sync loop never hands status/server an empty or partial map (they would
    # retire every pod's status and list no pods).
    started = clock.monotonic()
    hint = [False]  # a work changed containers since the last RelistHint
    loop.deps.changed_runtime = lambda: hint.__setitem__(0, True)

    def step(now: float) -> float | None:
        if ctx.stop.is_set():
            # A stop never stops pods by itself: with stopPodsOnExit the supervisor asks first
            # (StopAllPods) and stops this process once they are gone. A SIGTERM without that
            # request is an operator's stop/restart of this subsystem, a hung-heartbeat kill or
            # the parent-death signal (the supervisor or the fork server killed): the pods stay.
            if not stopping.active:
                stopping.done = True
                return None
            service.ignore_stop()  # stopping the pods the supervisor asked for goes on
        timeout = loop.step(now)
        if stopping.active and loop.all_stopped():
            publisher.publish(AllPodsStopped(pods=stopping.count, ts=clock.monotonic()))
            ctx.log.info("syncloop.pods.stopped", pods=stopping.count)
            if ctx.stop.is_set():
                stopping.done = True
                return None
            stopping.active = False
        if hint[0]:
            hint[0] = False
            if not stops.streaming:  # with events, PLEG hears of the change by itself
                publisher.publish(RelistHint(ts=clock.monotonic()))
        if not service.serving(owner) and (all(r.synced for r in replicas)
                                           or now - started >= SOURCES_WAIT):
            service.serve(owner)  # polled only once served
        events.flush(event_pub)
        return now + (TICK if timeout is None else min(TICK, timeout))

    subscriber = service.subscriber(TOPICS, on_bus)
    service.watch(wake.read_fd, wake.drain)
    service.watch(stops.wake_fd, on_runtime_events)
    ctx.log.info("syncloop.started", sources=sorted(_sources(ctx)))
    try:
        service.run(step, done=lambda: stopping.done)
    finally:
        stops.stop()
        pool.shutdown(wait=False, cancel_futures=True)
        service.close()
        event_pub.close()
        wake.close()
