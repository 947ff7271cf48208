"""Image and container garbage collection over CRI (KUBELET.md "Image and container GC").

Pure planning (``plan_image_gc``, ``plan_container_gc``) and the passes that carry a plan out
through a ``RuntimeClient``, so both runtimes are collected the same way. Times come in as
arguments (``now``: monotonic seconds); nothing here reads a clock."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cri_api.v1 import api_pb2 as pb

from podvisor.common.labels import CONTAINER_NAME, POD_UID
from podvisor.ipc.maps import PlegPod, PlegValue
from podvisor.services.cri import CriError, RuntimeClient

KEEP_DEAD_PER_CONTAINER = 1


class Log(Protocol):
    def info(self, event: str, **fields: Any) -> None: ...
    def warning(self, event: str, **fields: Any) -> None: ...


@dataclass(frozen=True)
class Usage:
    capacity: int  # bytes of the image filesystem
    used: int

    @property
    def percent(self) -> float:
        return 100.0 * self.used / self.capacity if self.capacity > 0 else 0.0


@dataclass
class ImageRecord:
    first_detected: float
    last_used: float = 0.0  # 0: never seen in use since this process started
    size: int = 0


@dataclass
class ImageTracker:
    """What the kubelet's image GC manager remembers: per image id, when it was first seen and
    when last used (in memory: a restarted imagegc starts over, and the minimum age then
    protects every image for one period, as after a kubelet restart)."""

    records: dict[str, ImageRecord] = field(default_factory=dict)

    def detect(self, images: Iterable[pb.Image], in_use: Collection[str], now: float) -> None:
        seen = set()
        for img in images:
            seen.add(img.id)
            rec = self.records.setdefault(img.id, ImageRecord(first_detected=now))
            rec.size = int(img.size)
            if img.id in in_use or any(t in in_use for t in img.repo_tags):
                rec.last_used = now
        for gone in set(self.records) - seen:
            del self.records[gone]


@dataclass(frozen=True)
class ImagePlan:
    remove: list[pb.Image]
    to_free: int  # bytes the pass must free to reach the low threshold (0: nothing to do)
    can_free: int  # bytes the plan frees


def images_in_use(pleg: Mapping[str, PlegValue], containers: Iterable[pb.Container]
                  ) -> set[str]:
    """Image ids and names of every container, running or exited: from the ``pleg`` map (the
    pods podvisor runs) and the runtime's own list (anything else it holds)."""
    used: set[str] = set()
    for record in pleg.values():
        if not isinstance(record, PlegPod):
            continue  # "_health"
        for c in record.containers:
            used.update(x for x in (c.image, c.image_ref) if x)
    for c in containers:
        used.update(x for x in (c.image_ref, c.image.image) if x)
    return used


def plan_image_gc(images: list[pb.Image], tracker: ImageTracker, in_use: Collection[str],
                  usage: Usage, high: int, low: int, min_age: float, now: float) -> ImagePlan:
    """The kubelet's rule: at or over ``high`` % used, free down to ``low`` %, least recently
    used first (ties: first detected), never an image in use, pinned, or younger than
    ``min_age``."""
    if usage.capacity <= 0 or usage.percent < high:
        return ImagePlan([], 0, 0)
    to_free = int(usage.used - low * usage.capacity / 100)
    if to_free <= 0:
        return ImagePlan([], 0, 0)
    return plan_free_space(images, tracker, in_use, to_free, min_age, now)


def plan_free_space(images: list[pb.Image], tracker: ImageTracker, in_use: Collection[str],
                    to_free: int | None, min_age: float, now: float) -> ImagePlan:
    """The kubelet's ``freeSpace``: unused, unpinned images at least ``min_age`` old, least
    recently used first (ties: first detected), until their sizes cover ``to_free`` (None:
    every one, ``DeleteUnusedImages``)."""
    candidates = []
    for img in images:
        rec = tracker.records.get(img.id)
        if rec is None or img.pinned or img.id in in_use or any(t in in_use for t in
                                                                  img.repo_tags):
            continue
        if now - rec.first_detected < min_age:
            continue
        candidates.append((rec.last_used, rec.first_detected, img))
    candidates.sort(key=lambda t: (t[0], t[1]))
    remove: list[pb.Image] = []
    freed = 0
    for _, _, img in candidates:
        if to_free is not None and freed >= to_free:
            break
        remove.append(img)
        freed += int(img.size)
    return ImagePlan(remove, to_free or 0, freed)


def image_gc_pass(cri: RuntimeClient, tracker: ImageTracker, pleg: Mapping[str, PlegValue],
                  usage_of: Callable[[], Usage], high: int, low: int, min_age: float,
                  now: float, log: Log,
                  on_removed: Callable[[], None] = lambda: None) -> tuple[ImagePlan, int]:
    """Detect, plan, remove; returns (the plan, bytes freed). An image that fails to go is
    logged and counted as not freed; ``on_removed`` is called once per image removed."""
    containers = cri.list_containers()
    in_use = images_in_use(pleg, containers)
    images = cri.list_images()
    tracker.detect(images, in_use, now)
    usage = usage_of()
    plan = plan_image_gc(images, tracker, in_use, usage, high, low, min_age, now)
    return plan, remove_images(cri, tracker, plan, log, on_removed)


def delete_unused_images(cri: RuntimeClient, tracker: ImageTracker,
                         pleg: Mapping[str, PlegValue], min_age: float, now: float, log: Log,
                         on_removed: Callable[[], None] = lambda: None) -> tuple[ImagePlan, int]:
    """The kubelet's ``DeleteUnusedImages`` (node-level reclaim before an eviction): every
    image no container uses, whatever the disk usage (still not one younger than ``min_age``
    or pinned); returns (the plan, bytes freed)."""
    log.info("imagegc.reclaim.images", message="Attempting to delete unused images")
    in_use = images_in_use(pleg, cri.list_containers())
    images = cri.list_images()
    tracker.detect(images, in_use, now)
    plan = plan_free_space(images, tracker, in_use, None, min_age, now)
    return plan, remove_images(cri, tracker, plan, log, on_removed)


def remove_images(cri: RuntimeClient, tracker: ImageTracker, plan: ImagePlan, log: Log,
                  on_removed: Callable[[], None]) -> int:
    """Remove the plan's images; the bytes freed (an image that fails to go is logged)."""
    freed = 0
    for img in plan.remove:
        try:
            cri.remove_image(img.id)
        except CriError as err:
            log.warning("imagegc.image.remove_failed", image=img.id, error=err.message)
            continue
        freed += int(img.size)
        on_removed()
        tracker.records.pop(img.id, None)
        log.info("imagegc.image.removed", image=img.id, tags=list(img.repo_tags),
                 size=int(img.size))
    return freed


@dataclass(frozen=True)
class ContainerPlan:
    containers: list[pb.Container]
    sandboxes: list[pb.PodSandbox]


def plan_container_gc(containers: list[pb.Container], sandboxes: list[pb.PodSandbox],
                      desired: Collection[str] | None,
                      owned: Callable[[str], bool] = lambda _uid: True,
                      terminated: Collection[str] = ()) -> ContainerPlan:
    """At most ``KEEP_DEAD_PER_CONTAINER`` dead (exited) containers per pod container besides
    the running one, none for pods no longer desired; dead sandboxes of pods no longer desired
    once they hold no container, and dead sandboxes older than a pod's newest. ``desired``
    None: not known yet (the replica has no snapshot): only the per-container rule applies.
    ``owned``: the pods this agent may collect (on a runtime shared with other clients, only
    the pods it made). ``terminated``: pods whose worker is done (Succeeded, Failed) whose
    dead containers and sandboxes all go too: the kubelet's ``DeleteAllUnusedContainers``
    (``evictTerminatedPods``), asked by the eviction manager's reclaim."""
    groups: dict[tuple[str, str], list[pb.Container]] = {}
    for c in containers:
        uid = c.labels.get(POD_UID, "")
        if not uid or c.state != pb.CONTAINER_EXITED or not owned(uid):
            continue
        groups.setdefault((uid, c.labels.get(CONTAINER_NAME, c.metadata.name)), []).append(c)
    remove: list[pb.Container] = []
    for (uid, _), dead in groups.items():
        dead.sort(key=lambda c: c.created_at, reverse=True)
        gone_pod = (desired is not None and uid not in desired) or uid in terminated
        keep = 0 if gone_pod else KEEP_DEAD_PER_CONTAINER
        remove += dead[keep:]
    gone = {c.id for c in remove}
    holding = {c.pod_sandbox_id for c in containers if c.id not in gone}
    newest: dict[str, int] = {}
    for s in sandboxes:
        uid = s.labels.get(POD_UID, "") or s.metadata.uid
        newest[uid] = max(newest.get(uid, 0), s.created_at)
    dead_boxes = []
    for s in sandboxes:
        uid = s.labels.get(POD_UID, "") or s.metadata.uid
        if not uid or s.state != pb.SANDBOX_NOTREADY or s.id in holding or not owned(uid):
            continue
        if (desired is not None and uid not in desired) or uid in terminated \
                or s.created_at < newest[uid]:
            dead_boxes.append(s)
    return ContainerPlan(remove, dead_boxes)


def owned_by(pod_logs_dir: Path) -> Callable[[str], bool]:
    """The pods whose log folder (``pod-logs/<ns>_<name>_<uid>``) this agent made."""
    def owned(uid: str) -> bool:
        return any(pod_logs_dir.glob(f"*_{uid}")) if uid and "/" not in uid else False
    return owned


def container_gc_pass(cri: RuntimeClient, desired: Collection[str] | None, log: Log,
                      owned: Callable[[str], bool] = lambda _uid: True,
                      terminated: Collection[str] = ()) -> tuple[ContainerPlan, int, int]:
    """Remove what ``plan_container_gc`` names, each container with its log file; returns
    (the plan, containers removed, sandboxes removed)."""
    plan = plan_container_gc(cri.list_containers(), cri.list_pod_sandbox(), desired, owned,
                             terminated)
    removed = boxes = 0
    for c in plan.containers:
        path = ""
        with contextlib.suppress(CriError):
            path = cri.container_status(c.id).log_path
        try:
            cri.remove_container(c.id)
        except CriError as err:
            log.warning("imagegc.container.remove_failed", container_id=c.id,
                        pod_uid=c.labels.get(POD_UID, ""), error=err.message)
            continue
        if path:
            with contextlib.suppress(OSError):
                os.unlink(path)
        removed += 1
        log.info("imagegc.container.removed", container_id=c.id,
                 pod_uid=c.labels.get(POD_UID, ""), container=c.metadata.name)
    for s in plan.sandboxes:
        try:
            cri.remove_pod_sandbox(s.id)
        except CriError as err:
            log.warning("imagegc.sandbox.remove_failed", sandbox_id=s.id,
                        pod_uid=s.metadata.uid, error=err.message)
            continue
        boxes += 1
        log.info("imagegc.sandbox.removed", sandbox_id=s.id, pod_uid=s.metadata.uid,
                 pod=f"{s.metadata.namespace}/{s.metadata.name}")
    return plan, removed, boxes
