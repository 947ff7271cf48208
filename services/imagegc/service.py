"""The imagegc service: container GC every minute, image GC every five minutes (the first of
each right after start), from replicas of ``pleg`` (last use) and ``desired`` (pods that still
exist). Stateless across restarts: what it knows is rebuilt from CRI and the maps.

The image filesystem's usage comes from ``UsageSource``: by default ``statvfs`` of the mount
point CRI ImageFsInfo names (the kubelet's cadvisor view); ``PODVISOR_IMAGEGC_USAGE_FILE``
names a JSON file ``{"capacity": BYTES, "used": BYTES}`` read at each pass instead, so tests
drive the thresholds without filling a disk."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, write_to_textfile

from podvisor.ipc.messages import NodeResourcesReclaimed, ReclaimNodeResources
from podvisor.services.cri import CriError, RuntimeClient
from podvisor.services.imagegc.gc import (
    ImageTracker,
    Log,
    Usage,
    container_gc_pass,
    delete_unused_images,
    image_gc_pass,
)
from podvisor.services.imagegc.logrotate import ROTATE_PERIOD, rotate_pass

CONTAINER_GC_PERIOD = 60.0
IMAGE_GC_PERIOD = 300.0
USAGE_FILE_ENV = "PODVISOR_IMAGEGC_USAGE_FILE"


class EventSink:
    """record(type, reason, message, obj) + flush(): events/recorder.py's Recorder and
    publisher, or a list in tests."""

    def __init__(self, record: Callable[[str, str, str, Mapping[str, Any]], None],
                 flush: Callable[[], object]) -> None:
        self.record = record
        self.flush = flush


def usage_source(cri: RuntimeClient, env: Mapping[str, str]) -> Callable[[], Usage]:
    path = env.get(USAGE_FILE_ENV, "")
    if path:
        def from_file() -> Usage:
            doc = json.loads(Path(path).read_text())
            return Usage(int(doc["capacity"]), int(doc["used"]))
        return from_file

    def from_fs() -> Usage:
        info = cri.image_fs_info()
        mount = info.image_filesystems[0].fs_id.mountpoint if info.image_filesystems else "/"
        st = os.statvfs(mount or "/")
        capacity = st.f_blocks * st.f_frsize
        return Usage(capacity, capacity - st.f_bavail * st.f_frsize)
    return from_fs


class ImageGC:
    """``step(now)`` runs whatever pass is due and returns when the next one is."""

    def __init__(self, cri: RuntimeClient, usage_of: Callable[[], Usage], log: Log,
                 events: EventSink, node: str, high: int, low: int, min_age: float,
                 metrics_path: Path | None = None,
                 owned: Callable[[str], bool] = lambda _uid: True) -> None:
        self.cri, self.usage_of, self.log, self.events, self.node = (cri, usage_of, log,
                                                                      events, node)
        self.high, self.low, self.min_age = high, low, min_age
        self.tracker = ImageTracker()
        self.owned = owned
        self.log_limits: tuple[int, int] | None = None  # (containerLogMaxSize, MaxFiles)
        self.stamp: Callable[[], str] = lambda: "0"
        self.next_rotation = 0.0
        self.next_container_gc = 0.0
        self.next_image_gc = 0.0
        self.last_reclaim: NodeResourcesReclaimed | None = None
        self.metrics_path = metrics_path
        self.registry = CollectorRegistry()
        self.failures = Counter("podvisor_image_gc_failures", "image GC passes that could not "
                                "free enough space", registry=self.registry)
        self.freed = Counter("podvisor_image_gc_freed_bytes", "bytes freed by image GC",
                             registry=self.registry)
        self.usage_pct = Gauge("podvisor_image_fs_usage_percent", "image filesystem usage "
                               "seen by the last image GC pass", registry=self.registry,
                               multiprocess_mode="mostrecent")
        # the kubelet's name; reason "space": this GC removes images for disk usage only
        self.collected = Counter("kubelet_image_garbage_collected", "Total number of images "
                                 "garbage collected by the kubelet, whether through disk usage "
                                 "or image age.", ["reason"], registry=self.registry)

    def step(self, now: float, pleg: Mapping[str, Any],
             desired: Collection[str] | None) -> float:
        if now >= self.next_container_gc:
            self.next_container_gc = now + CONTAINER_GC_PERIOD
            try:
                container_gc_pass(self.cri, desired, self.log, self.owned)
            except CriError as err:
                self.log.warning("imagegc.container_gc.failed", error=err.message)
        if now >= self.next_image_gc:
            self.next_image_gc = now + IMAGE_GC_PERIOD
            self.image_pass(now, pleg)
        if self.log_limits is None:
            return min(self.next_container_gc, self.next_image_gc)
        if now >= self.next_rotation:
            self.next_rotation = now + ROTATE_PERIOD
            # a container's failure is logged and skipped inside (no listing call to fail)
            rotate_pass(self.cri, pleg, *self.log_limits, self.stamp(), self.log)
        return min(self.next_container_gc, self.next_image_gc, self.next_rotation)

    def reclaim(self, now: float, request: ReclaimNodeResources, pleg: Mapping[str, Any],
                desired: Collection[str], terminated: Collection[str]
                ) -> NodeResourcesReclaimed:
        """The eviction manager's node-level reclaim, in the kubelet's order: every unused
        dead container (all of those of ``terminated`` and removed pods), then every unused
        image. A request already answered (its ``id``) is answered again, not redone."""
        if self.last_reclaim is not None and self.last_reclaim.id == request.id:
            return self.last_reclaim
        self.log.info("imagegc.reclaim.begin", request=request.id, signal=request.signal)
        containers = boxes = images = freed = 0
        errors: list[str] = []
        if request.containers:
            try:
                _, containers, boxes = container_gc_pass(self.cri, desired, self.log,
                                                         self.owned, terminated)
            except CriError as err:
                errors.append(f"container GC: {err.message}")
        if request.images:
            try:
                plan, freed = delete_unused_images(self.cri, self.tracker, pleg, self.min_age,
                                                   now, self.log,
                                                   self.collected.labels("space").inc)
                images = sum(1 for img in plan.remove if img.id not in self.tracker.records)
                self.freed.inc(freed)
            except CriError as err:
                errors.append(f"image GC: {err.message}")
        answer = NodeResourcesReclaimed(id=request.id, containers=containers,
                                        sandboxes=boxes, images=images, image_bytes=freed,
                                        errors="; ".join(errors))
        self.log.info("imagegc.reclaim.done", request=request.id, containers=containers,
                      sandboxes=boxes, images=images, image_bytes=freed, errors=answer.errors)
        self.last_reclaim = answer
        return answer

    def image_pass(self, now: float, pleg: Mapping[str, Any]) -> None:
        try:
            plan, freed = image_gc_pass(self.cri, self.tracker, pleg, self.usage_of, self.high,
                                        self.low, self.min_age, now, self.log,
                                        self.collected.labels("space").inc)
        except (CriError, OSError, ValueError, KeyError) as err:
            self.log.warning("imagegc.image_gc.failed", error=str(err))
            return
        self.freed.inc(freed)
        with_usage = self.usage_of()
        self.usage_pct.set(with_usage.percent)
        if plan.to_free > 0:
            self.log.info("imagegc.image_gc.pass", to_free=plan.to_free, freed=freed,
                          removed=len(plan.remove))
        if plan.to_free > 0 and freed < plan.to_free:
            self.failures.inc()
            message = (f"Failed to garbage collect required amount of images. Attempted to "
                       f"free {plan.to_free} bytes, but only found {freed} bytes eligible to "
                       "free.")
            self.log.warning("imagegc.image_gc.short", to_free=plan.to_free, freed=freed)
            self.events.record("Warning", "FreeDiskSpaceFailed", message,
                               {"kind": "Node", "name": self.node})
        self.events.flush()
        if self.metrics_path is not None:
            try:
                write_to_textfile(str(self.metrics_path), self.registry)
            except OSError as err:
                self.log.warning("imagegc.metrics.write_failed", error=str(err))
