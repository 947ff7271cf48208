"""The syncloop process: ``SyncLoopService`` wires the bus, CRI and the ``desired`` map to
``SyncLoop`` (its ``__init__`` is the composition root: every part built once) and runs it.

One service loop over: pod sets (the replicated maps ``pods-file`` / ``pods-http`` that the source
processes own, so a restarted sync loop has every set from a snapshot at once), PLEG events
(``pleg.pod.event``, which trigger the pod's worker at once), the sync loop's own container
event stream (``runtime_events``: a stop syncs the pod at once, from the event's state when
safe; the step runs right after, before the other inputs), stop-all requests
(``syncloop.pods.stopall``; bus messages go to their handler by type), snapshot requests on the
``desired`` map's ROUTER, and a wake pipe the worker threads write when work finishes; the poll
timeout is the next due pod, housekeeping (2 s) or at most 1 s (the tick).

SIGTERM: with ``stopPodsOnExit`` every pod is terminated (within its grace) before exiting;
otherwise the process exits at once and pods keep running (a restarted sync loop adopts them).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from podvisor.common import crashpoints
from podvisor.common.child import ChildContext
from podvisor.common.endpoint import cri_endpoint
from podvisor.common.pool import ElasticPool
from podvisor.common.service import ServiceLoop, WakePipe
from podvisor.ipc.maps import (
    DESIRED,
    NODE_SHUTDOWN,
    NODE_SHUTDOWN_KEY,
    POD_SET_KEY,
    PRESSURE,
    PRESSURE_KEY,
    PROBES,
    VOLUMES,
    PodProbes,
    PodSetValue,
    pods_map,
)
from podvisor.ipc.messages import (
    AllPodsStopped,
    FailPod,
    Message,
    PodLifecycleEvent,
    RelistHint,
    StopAllPods,
)
from podvisor.ipc.volumemaps import PodVolumes
from podvisor.services.apiserver import ApiConnection
from podvisor.services.cri import new_instrumented_client, new_runtime_client
from podvisor.services.events import EventingLog, EventPublisher, Recorder
from podvisor.services.prober import failed_probes, liveness_failed
from podvisor.services.syncloop.allocation import FILE as ALLOCATION_FILE
from podvisor.services.syncloop.allocation import AllocationStore
from podvisor.services.syncloop.apiobjects import ApiObjects
from podvisor.services.syncloop.backoff import BackoffPolicy, CrashBackoff, SharedBackoff
from podvisor.services.syncloop.cgroupfs import new_cgroup_fs
from podvisor.services.syncloop.dns import DnsSettings
from podvisor.services.syncloop.loop import LoopDeps, SyncLoop
from podvisor.services.syncloop.metrics import WorkerMetrics
from podvisor.services.syncloop.network import NetworkState
from podvisor.services.syncloop.node import (
    admission_capacity,
    discover_node_facts,
    ephemeral_storage_allocatable,
)
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
from podvisor.services.syncloop.runtimeclass import RuntimeClasses
from podvisor.services.syncloop.syncpod import SyncDeps
from podvisor.services.syncloop.terminate import Log
from podvisor.services.syncloop.workers import Timing, WorkerTable

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


class MountedVolumes:
    """The ``volumes`` map as the sync loop reads it: pod UID -> the volume manager's view of
    its mounted volumes. Written on the loop's thread, read from pool threads (``get``: one
    dict lookup)."""

    def __init__(self) -> None:
        self._pods: dict[str, PodVolumes] = {}

    def get(self, uid: str) -> PodVolumes | None:
        return self._pods.get(uid)

    def update(self, uid: str, new: object) -> bool:
        """Take a new value; True when the pod's volumes became ready (sync it now)."""
        before = self._pods.get(uid)
        if not isinstance(new, PodVolumes):
            self._pods.pop(uid, None)
            return False
        self._pods[uid] = new
        return new.ready and (before is None or not before.ready)


def new_sync_deps(ctx: ChildContext, log: Log, shared: bool = True,
                  volumes: MountedVolumes | None = None) -> SyncDeps:
    """What SyncPod needs, from the config (also RunOnce's, with ``shared`` off: no listing
    shared between workers and no image presence cache, every read fresh)."""
    cfg, clock = ctx.config, ctx.clock
    sl = cfg.syncloop
    policy = BackoffPolicy(sl.crash_loop_backoff_initial, sl.crash_loop_backoff_max,
                           sl.crash_loop_backoff_reset)
    # the kubelet's runtime operation metrics (multiprocess directory in the agent)
    registry = CollectorRegistry(auto_describe=False)
    cri = new_instrumented_client(
        new_runtime_client(cri_endpoint(cfg.runtime_endpoint, ctx.paths.cri_socket, cfg.cri_proxy),
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
                    cgroups=cgroups, node=replace(
                        discover_node_facts(cfg.address, cfg.node_name, cfg.node_ips),
                        ephemeral_storage_bytes=ephemeral_storage_allocatable(cfg.root_dir, cfg)),
                    cache=RuntimeCache(cri, clock.monotonic, clock.wall) if shared else None,
                    images=ImagePresence(cri, clock.monotonic) if shared else None,
                    network=NetworkState(), pull_slots=pull_slots(cfg),
                    objects=ApiObjects(
                        ApiConnection(cfg.kubeconfig), cfg.api_object_cache_ttl,
                        clock.monotonic, clock.wall,
                        strategy=cfg.config_map_and_secret_change_detection_strategy,
                        watch_timeout=cfg.api_watch_timeout, max_delay=cfg.api_retry_max_delay)
                    if cfg.kubeconfig else None,
                    runtime_classes=_runtime_classes(cfg),
                    started=started.inc, crash=crashpoints.from_env("syncloop"),
                    dns=DnsSettings(tuple(cfg.cluster_dns), cfg.cluster_domain,
                                    cfg.resolv_conf),
                    docker_config_paths=docker_config_paths(ctx.paths.root),
                    volumes=volumes.get if volumes is not None else lambda uid: None,
                    allocation=AllocationStore(ctx.paths.state_dir / ALLOCATION_FILE, log))


def api_connections(sync: SyncDeps) -> list[ApiConnection]:
    """The sync loop's API clients: the pods' Secrets and ConfigMaps (``ApiObjects``) and the
    RuntimeClass manager's (none without an API server)."""
    return [c.conn for c in (sync.objects, sync.runtime_classes) if c is not None]


def _runtime_classes(cfg: Any) -> RuntimeClasses | None:
    """The RuntimeClass manager, started (its informer); None without an API server, as the
    kubelet builds none without a client."""
    if not cfg.kubeconfig:
        return None
    classes = RuntimeClasses(ApiConnection(cfg.kubeconfig), watch_timeout=cfg.api_watch_timeout,
                             max_delay=cfg.api_retry_max_delay)
    classes.start()
    return classes


def docker_config_paths(root: Path) -> tuple[Path, ...]:
    """Where the node's registry credentials are looked for, in the kubelet's order
    (``credentialprovider.DefaultDockerConfigJSONPaths`` with ``--root-dir``)."""
    home = os.environ.get("HOME", "")
    return tuple(p for p in (root, Path.cwd(), Path(home) / ".docker" if home else None,
                             Path("/.docker")) if p is not None)


def pull_slots(cfg: Any) -> threading.Semaphore | None:
    """serializeImagePulls (default): one pull at a time; else maxParallelImagePulls at once
    (0: no limit)."""
    if cfg.serialize_image_pulls:
        return threading.Semaphore(1)
    n = int(cfg.max_parallel_image_pulls)
    return threading.Semaphore(n) if n > 0 else None


def _resolver(table: WorkerTable) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Fill an event's pod name, namespace and manifest file from the worker table."""

    def resolve(obj: dict[str, Any]) -> dict[str, Any]:
        w = table.get(str(obj.get("uid", "")))
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


class FailedProbes:
    """The prober's ``probes`` map as the sync loop reads it: pod UID -> container ID -> the
    liveness/startup probe that failed. Written on the loop's thread, read from pool threads
    (``get``: one dict lookup)."""

    def __init__(self) -> None:
        self._failed: dict[str, dict[str, str]] = {}
        self._started: dict[str, frozenset[str]] = {}

    def get(self, uid: str) -> Mapping[str, str]:
        return self._failed.get(uid, {})

    def started(self, uid: str) -> frozenset[str]:
        """IDs of the pod's containers whose startup probe succeeded."""
        return self._started.get(uid, frozenset())

    def update(self, uid: str, old: PodProbes | None, new: PodProbes | None) -> bool:
        """Take a new verdict; True when a container's probe newly failed, or its startup
        probe newly succeeded (a sidecar's lets the next init container start): sync it now."""
        probes = failed_probes(new)
        if probes:
            self._failed[uid] = probes
        else:
            self._failed.pop(uid, None)
        started = frozenset(v.container_id for v in (new.containers.values() if new else ())
                            if v.started and v.container_id)
        before = self._started.get(uid, frozenset())
        if started:
            self._started[uid] = started
        else:
            self._started.pop(uid, None)
        return bool(set(probes) - liveness_failed(old)) or bool(started - before)


class _Flag:
    """Set by the loop's works (``changed_runtime``), taken once per turn."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def take(self) -> bool:
        was, self._set = self._set, False
        return was


class _Stopping:
    """Where a stop of every pod stands (``syncloop.pods.stopall`` or the process's stop)."""

    def __init__(self) -> None:
        self.active = False
        self.count = 0
        self.done = False  # the process may exit


class SyncLoopService:
    """The syncloop process. ``__init__`` is its composition root: every part is built once,
    from the config, in the order its dependencies need (nothing is patched in afterwards);
    then ``run`` turns the service loop with ``step``. Bus messages go to their handler by type
    (``handlers``)."""

    def __init__(self, ctx: ChildContext) -> None:
        cfg, clock = ctx.config, ctx.clock
        self.ctx, self.clock = ctx, clock
        self.service = ServiceLoop(ctx)
        self.publisher = self.service.publisher()
        self.pool = ElasticPool(max_workers=POOL_THREADS, thread_name_prefix="podworker")
        self.wake = WakePipe()
        table = WorkerTable(Timing(resync=cfg.sync_frequency))
        self.events = Recorder(ctx.name, clock.wall, resolve=_resolver(table))
        self.event_pub = EventPublisher(ctx.zctx, ctx.paths, ctx.name, clock=clock)
        self.volumes = MountedVolumes()
        sync = new_sync_deps(ctx, EventingLog(ctx.log, self.events), volumes=self.volumes)
        for conn in api_connections(sync):  # injected api faults (issue 28) reach them too
            self.service.on_faults(conn.faults.set)
        self.owner = self.service.owner(self.publisher, DESIRED, serving=False)
        self.probes = FailedProbes()
        self.hint = _Flag()  # a work changed containers since the last RelistHint
        metrics = WorkerMetrics()  # multiprocess directory in the agent
        self.loop = SyncLoop(LoopDeps(
            sync=sync, pod_config=new_pod_config(_sources(ctx)), table=table,
            desired=self.owner, submit=self._submit, wake=self.wake.wake,
            node_name=cfg.node_name, liveness_failed=self.probes.get,
            started=self.probes.started,
            changed_runtime=self.hint.set,
            capacity=admission_capacity(sync.node, cfg) if cfg.kubeconfig else None,
            observe_work=metrics.observe_work, restarted=metrics.restarted,
            pressure=self._pressure, shutting_down=self._shutting_down))
        self.cache = sync.cache
        self.stops, self.seen = new_stop_watcher(sync.cri, ctx.log), SeenStops()
        self.stopping = _Stopping()
        # Like PLEG's relist-before-serve: no `desired` snapshot until every source's set is
        # in, so a restarted sync loop never hands status/server an empty or partial map
        # (they would retire every pod's status and list no pods).
        self.started = clock.monotonic()
        self.sources = [self.service.replica(pods_map(src), self._feeder(src))
                        for src in sorted(_sources(ctx))]
        self.service.replica(PROBES, self._on_probes)
        # the volumes process: pods with mounted volumes (claims, csi, nfs, iscsi, fc,
        # flexVolume) wait for its mounts
        self.service.replica(VOLUMES, self._on_volumes)
        # the eviction manager's node conditions (admission); never waited for: without the
        # eviction process (or before its first pass) no pressure is known
        self.pressure_map = self.service.replica(PRESSURE)
        # a graceful node shutdown under way (admission refuses new pods, reason NodeShutdown);
        # never waited for either: without the nodeshutdown process there is none
        self.shutdown_map = self.service.replica(NODE_SHUTDOWN)
        self.handlers: dict[type[Message], Callable[[Any, float], None]] = {
            PodLifecycleEvent: self._on_pleg_event,
            StopAllPods: self._on_stop_all,
            FailPod: self._on_fail_pod,
        }
        self.subscriber = self.service.subscriber([m.TOPIC for m in self.handlers],
                                                  self._on_bus)
        self.service.watch(self.wake.read_fd, self.wake.drain)
        self.service.watch(self.stops.wake_fd, self._on_runtime_events)

    def _submit(self, fn: Callable[[], None]) -> None:
        self.pool.submit(fn)

    # --- inputs (the loop's thread) -----------------------------------------------------------
    def _feeder(self, source: str) -> Callable[[str, object, object], None]:
        """Each new set of ``source`` goes to the merge."""

        def on_change(key: str, old: object, new: object) -> None:
            if key == POD_SET_KEY and isinstance(new, PodSetValue):
                self.loop.handle_pod_set(source, list(new.pods), self.clock.monotonic(),
                                         new.errors)
        return on_change

    def _on_probes(self, key: str, old: PodProbes | None, new: PodProbes | None) -> None:
        """A new liveness/startup failure syncs the pod at once (its container is killed and
        restarted per policy); syncs read the failed IDs."""
        if self.probes.update(key, old, new):
            self.loop.handle_pleg_event(key, self.clock.monotonic())

    def _on_volumes(self, key: str, old: object, new: object) -> None:
        """A pod's volumes became ready: it syncs now (its sandbox waited for them)."""
        if self.volumes.update(key, new):
            self.loop.handle_pleg_event(key, self.clock.monotonic())

    def _on_bus(self) -> None:
        while (env := self.subscriber.recv(0)) is not None:
            handler = self.handlers.get(type(env.message))
            if handler is not None:
                handler(env.message, self.clock.monotonic())

    def _on_pleg_event(self, event: PodLifecycleEvent, now: float) -> None:
        if _worthy(event.type, event.container_id, self.seen, self.stops.streaming):
            self.loop.handle_pleg_event(event.pod_uid, now, float(event.ts))

    def _pressure(self) -> tuple[str, ...]:
        value = self.pressure_map.get(PRESSURE_KEY)
        return value.conditions if value is not None else ()

    def _shutting_down(self) -> bool:
        value = self.shutdown_map.get(NODE_SHUTDOWN_KEY)
        return value is not None and value.active

    def _on_fail_pod(self, request: FailPod, now: float) -> None:
        """Another process fails a pod for good (eviction's reason Evicted, say)."""
        self.loop.fail_pod(request.uid, request.reason, request.message, request.grace,
                           request.event_type)

    def _on_stop_all(self, request: StopAllPods, now: float) -> None:
        if not self.stopping.active:
            self.stopping.active, self.stopping.count = True, len(self.loop.deps.table.workers)
            self.loop.stop_all(now)

    def _on_runtime_events(self) -> None:
        now = self.clock.monotonic()
        items = self.stops.drain()
        if self.cache is not None:
            self.cache.changed()  # an event, a lost one or a stream mode change
            self.cache.watched(self.stops.streaming)
        for uid, event in pod_events(items):
            if is_stop(event):
                self.seen.add(event.container_id)
            self.loop.handle_container_event(uid, event, now,
                                             event_mono(event, now, self.clock.wall()))
        self.loop.step(now)  # hand a restart out before reading the other inputs

    # --- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        self.ctx.log.info("syncloop.started", sources=sorted(_sources(self.ctx)))
        self.service.run(self.step, done=lambda: self.stopping.done)

    def step(self, now: float) -> float | None:
        ctx, stopping = self.ctx, self.stopping
        if ctx.stop.is_set():
            # A stop never stops pods by itself: with stopPodsOnExit the supervisor asks first
            # (StopAllPods) and stops this process once they are gone. A SIGTERM without that
            # request is an operator's stop/restart of this subsystem, a hung-heartbeat kill or
            # the parent-death signal (the supervisor or the fork server killed): the pods stay.
            if not stopping.active:
                stopping.done = True
                return None
            self.service.ignore_stop()  # stopping the pods the supervisor asked for goes on
        timeout = self.loop.step(now)
        if stopping.active and self.loop.all_stopped():
            self.publisher.publish(AllPodsStopped(pods=stopping.count,
                                                  ts=self.clock.monotonic()))
            ctx.log.info("syncloop.pods.stopped", pods=stopping.count)
            if ctx.stop.is_set():
                stopping.done = True
                return None
            stopping.active = False
        if self.hint.take() and not self.stops.streaming:
            # with events, PLEG hears of the change by itself
            self.publisher.publish(RelistHint(ts=self.clock.monotonic()))
        if not self.service.serving(self.owner) and (
                all(r.synced for r in self.sources) or now - self.started >= SOURCES_WAIT):
            self.service.serve(self.owner)  # polled only once served
        self.events.flush(self.event_pub)
        return now + (TICK if timeout is None else min(TICK, timeout))

    def close(self) -> None:
        self.stops.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)  # running works are not waited for
        self.service.close()
        self.event_pub.close()
        self.wake.close()


def run(ctx: ChildContext) -> None:
    service = SyncLoopService(ctx)
    try:
        service.run()
    finally:
        service.close()
