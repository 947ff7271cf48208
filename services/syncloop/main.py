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

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import zmq

from podvisor.ipc.bus import Publisher, Subscriber
from podvisor.ipc.clone import MapOwner, MapReplica
from podvisor.ipc.codec import Envelope
from podvisor.ipc.messages import AllPodsStopped
from podvisor.services.cri import new_runtime_client
from podvisor.services.events.logbridge import EventingLog
from podvisor.services.events.publisher import EventPublisher
from podvisor.services.events.recorder import Recorder
from podvisor.services.prober.verdicts import liveness_failed
from podvisor.services.sources.publish import SET_KEY, map_name
from podvisor.services.syncloop.backoff import BackoffPolicy, CrashBackoff, SharedBackoff
from podvisor.services.syncloop.cgroupfs import new_cgroup_fs
from podvisor.services.syncloop.loop import LoopDeps, SyncLoop
from podvisor.services.syncloop.network import NetworkState
from podvisor.services.syncloop.node import discover_node_facts
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
from podvisor.supervisor.child import ChildContext

TOPICS = ("pleg.pod.event", "syncloop.pods.stopall")
TICK = 1.0
SOURCES_WAIT = 10.0  # serve `desired` without a source's set after this long (source down)
POOL_THREADS = 128
IMAGE_BACKOFF = BackoffPolicy(initial=10.0, cap=300.0, reset_after=600.0)


class _WakePipe:
    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        for fd in (self.read_fd, self.write_fd):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # full pipe: already awake; closed: stopping
            os.write(self.write_fd, b"x")

    def drain(self) -> None:
        try:
            while os.read(self.read_fd, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)


def _sources(ctx: ChildContext) -> set[str]:
    out = set()
    if ctx.config.static_pod_path:
        out.add("file")
    if ctx.config.static_pod_url:
        out.add("http")
    return out


def _endpoint(ctx: ChildContext) -> str:
    ep: str = ctx.config.runtime_endpoint
    return f"unix://{ctx.paths.cri_socket}" if ep == "embedded" else ep


def new_sync_deps(ctx: ChildContext, log: Log, shared: bool = True) -> SyncDeps:
    """What SyncPod needs, from the config (also RunOnce's, with ``shared`` off: no listing
    shared between workers and no image presence cache, every read fresh)."""
    cfg = ctx.config
    sl = cfg.syncloop
    policy = BackoffPolicy(sl.crash_loop_backoff_initial, sl.crash_loop_backoff_max,
                           sl.crash_loop_backoff_reset)
    cri = new_runtime_client(_endpoint(ctx), timeout=cfg.runtime_request_timeout)
    ctx.paths.pods_dir.mkdir(parents=True, exist_ok=True)
    ctx.paths.pod_logs_dir.mkdir(parents=True, exist_ok=True)
    cgroups = (new_pod_cgroups(cfg.cgroup_root, new_cgroup_fs(), log) if cfg.cgroup_root
               else None)
    return SyncDeps(cri=cri, pods_dir=ctx.paths.pods_dir, pod_logs_dir=ctx.paths.pod_logs_dir,
                    backoff=SharedBackoff(CrashBackoff(policy)),
                    image_backoff=SharedBackoff(CrashBackoff(IMAGE_BACKOFF)),
                    mono=time.monotonic, wall=time.time, sleep=time.sleep, log=log,
                    cgroups=cgroups, node=discover_node_facts(cfg.address, cfg.node_name),
                    cache=RuntimeCache(cri, time.monotonic, time.time) if shared else None,
                    images=ImagePresence(cri, time.monotonic) if shared else None,
                    network=NetworkState(), pull_slots=pull_slots(cfg))


def pull_slots(cfg: Any) -> threading.Semaphore | None:
    """serializeImagePulls (default): one pull at a time; else maxParallelImagePulls at once
    (0: no limit)."""
    if cfg.serialize_image_pulls:
        return threading.Semaphore(1)
    n = int(cfg.max_parallel_image_pulls)
    return threading.Semaphore(n) if n > 0 else None


def build(ctx: ChildContext, publisher: Publisher, pool: ThreadPoolExecutor,
          wake: _WakePipe, events: Recorder | None = None) -> tuple[SyncLoop, MapOwner]:
    """The composition root: every part of the sync loop, from the config."""
    cfg = ctx.config
    log = EventingLog(ctx.log, events) if events is not None else ctx.log
    sync = new_sync_deps(ctx, log)
    owner = MapOwner(ctx.zctx, ctx.paths, publisher, "desired",
                     heartbeat_interval=cfg.supervision.heartbeat_interval)

    def submit(fn: Callable[[], None]) -> None:
        pool.submit(fn)

    table = WorkerTable(Timing(resync=cfg.sync_frequency))
    loop = SyncLoop(LoopDeps(sync=sync, pod_config=new_pod_config(_sources(ctx)), table=table,
                             desired=owner, submit=submit,
                             wake=wake.wake, node_name=cfg.node_name))
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


def _source_replicas(ctx: ChildContext, loop: SyncLoop) -> list[MapReplica]:
    """One replica per configured source; each new set of a source goes to the merge."""

    def feeder(source: str) -> Callable[[str, object, object], None]:
        def on_change(key: str, old: object, new: object) -> None:
            if key == SET_KEY and isinstance(new, dict):
                loop.handle_pod_set(source, list(new.get("pods", [])), time.monotonic())
        return on_change

    return [MapReplica(ctx.zctx, ctx.paths, map_name(src), feeder(src))
            for src in sorted(_sources(ctx))]


def _probes_replica(ctx: ChildContext, loop: SyncLoop) -> MapReplica:
    """The prober's ``probes`` map: a new liveness/startup failure syncs the pod at once (its
    container is killed and restarted per policy); syncs read the failed IDs."""
    failed: dict[str, frozenset[str]] = {}

    def on_change(key: str, old: object, new: object) -> None:
        ids = liveness_failed(new)
        if ids:
            failed[key] = ids
        else:
            failed.pop(key, None)
        if ids - liveness_failed(old):
            loop.handle_pleg_event(key, time.monotonic())

    loop.deps.liveness_failed = lambda uid: failed.get(uid, frozenset())
    return MapReplica(ctx.zctx, ctx.paths, "probes", on_change)


def run(ctx: ChildContext) -> None:
    publisher = Publisher(ctx.zctx, ctx.paths, ctx.name)
    subscriber = Subscriber(ctx.zctx, ctx.paths, TOPICS)
    pool = ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="podworker")
    wake = _WakePipe()
    events = Recorder(ctx.name)
    event_pub = EventPublisher(ctx.zctx, ctx.paths, ctx.name)
    loop, owner = build(ctx, publisher, pool, wake, events)
    events.resolve = _resolver(loop)
    replicas = _source_replicas(ctx, loop)
    probes = _probes_replica(ctx, loop)
    poller = zmq.Poller()
    for replica in replicas:
        for sock in replica.sockets:
            poller.register(sock, zmq.POLLIN)
    poller.register(probes.socket, zmq.POLLIN)  # the SUB only: the snapshot DEALER is replaced
    poller.register(subscriber.socket, zmq.POLLIN)
    poller.register(wake.read_fd, zmq.POLLIN)
    stops, seen = new_stop_watcher(loop.deps.sync.cri, ctx.log), SeenStops()
    cache = loop.deps.sync.cache
    poller.register(stops.wake_fd, zmq.POLLIN)
    ctx.log.info("syncloop.started", sources=sorted(_sources(ctx)))
    stopping_pods, stopped_count = False, 0
    # Like PLEG's relist-before-serve: no `desired` snapshot until every source's set is in, so
    # a restarted sync loop never hands status/server an empty or partial map (they would
    # retire every pod's status and list no pods).
    started, serving = time.monotonic(), False
    try:
        while True:
            now = time.monotonic()
            if ctx.stop.is_set() and not stopping_pods:
                if not ctx.config.stop_pods_on_exit:
                    break
                stopping_pods, stopped_count = True, len(loop.deps.table.workers)
                loop.stop_all(now)
            timeout = loop.step(now)
            if stopping_pods and loop.all_stopped():
                publisher.publish(AllPodsStopped(pods=stopped_count, ts=time.monotonic()))
                ctx.log.info("syncloop.pods.stopped", pods=stopped_count)
                if ctx.stop.is_set():
                    break
                stopping_pods = False
            wait = TICK if timeout is None else min(TICK, timeout)
            ready = dict(poller.poll(max(0, int(wait * 1000))))
            if wake.read_fd in ready:
                wake.drain()
            if stops.wake_fd in ready:
                now = time.monotonic()
                items = stops.drain()
                if cache is not None:
                    cache.changed()  # an event, a lost one or a stream mode change
                    cache.watched(stops.streaming)
                for uid, event in pod_events(items):
                    if is_stop(event):
                        seen.add(event.container_id)
                    loop.handle_container_event(uid, event, now,
                                                event_mono(event, now, time.time()))
                loop.step(now)  # hand a restart out before reading the other inputs
            while (env := subscriber.recv(0)) is not None:
                if _dispatch(loop, env, time.monotonic(), seen, stops.streaming) \
                        and not stopping_pods:
                    stopping_pods = True
                    stopped_count = len(loop.deps.table.workers)
                    loop.stop_all(time.monotonic())
            for replica in replicas:
                replica.pump(0)
            probes.pump(0)
            if not serving and (all(r.synced for r in replicas)
                                or time.monotonic() - started >= SOURCES_WAIT):
                serving = True
                poller.register(owner.socket, zmq.POLLIN)  # polled only once served
            if serving:
                owner.serve()
            owner.tick(time.monotonic())
            events.flush(event_pub)
            ctx.heartbeat()
    finally:
        stops.stop()
        pool.shutdown(wait=False, cancel_futures=True)
        owner.close()
        for replica in replicas:
            replica.close()
        probes.close()
        subscriber.close()
        publisher.close()
        event_pub.close()
        wake.close()
        loop.deps.sync.cri.close()
