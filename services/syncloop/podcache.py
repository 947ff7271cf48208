"""A runtime listing shared by pod workers (the kubelet's pod cache, ``GetNewerThan``).

A worker must sync against a runtime snapshot newer than its last sync; it does not need one
of its own. ``RuntimeCache.pod(uid, newer_than)`` returns the pod's ``PodRuntime`` from the
last full listing (``ListPodSandbox`` + ``ListContainers``, grouped by the pod UID label) when
that listing started at or after ``newer_than`` and is at most ``max_age`` old; otherwise it
lists again first. So 200 new pods, or every pod due for its periodic resync within a few
seconds, cost two list calls instead of two each. The ContainerStatus of a pod's newest
container per name is still read per pod, and only when it is needed (not running, or a
running one whose back-off entry must be rebuilt).

Workers triggered by a runtime change (an event, a probe verdict) do not come here: they read
their pod fresh (``read_pod_runtime``), which is cheaper than a full listing for one pod.

Housekeeping (every 2 s) takes the pod UIDs from the same listing (``pod_uids``) when it is at
most 2 s old, as the kubelet's housekeeping reads its ``runtimeCache`` (2 s period): one
listing serves housekeeping and resyncs.

A quiet runtime is not listed again every few seconds: while the sync loop's own event stream is
live (``watched(True)``) and nothing changed since a listing started (no stream event, no event
lost, no work of the sync loop that acted on the runtime: ``changed()``), that listing is the
runtime's current state, for resyncs and housekeeping alike, up to ``QUIET_MAX_AGE`` (like
PLEG's relist in stream mode). ``changed`` and ``watched`` are called from the loop thread
(plain attribute writes).

``ImagePresence`` does the same for ImageStatus.

Thread-safe: one lock serialises refreshes, so threads that wait for it find the listing that
was taken meanwhile (started after their ``newer_than``) and reuse it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import RuntimeClient
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.runtime_state import NeedStatus, PodRuntime, pod_runtime

MAX_AGE = 5.0  # seconds: a resync never acts on an older listing (a missed event is caught)
QUIET_MAX_AGE = 30.0  # seconds: an unchanged listing's life while the event stream is live
IMAGE_TTL = 5.0  # seconds an image seen present is taken as present (below the 10 s error delay)

_Listing = tuple[list[pb.PodSandbox], list[pb.Container]]


class RuntimeCache:
    def __init__(self, cri: RuntimeClient, mono: Callable[[], float],
                 wall: Callable[[], float], max_age: float = MAX_AGE,
                 quiet_max_age: float = QUIET_MAX_AGE) -> None:
        self._cri = cri
        self._mono = mono
        self._wall = wall
        self._max_age = max_age
        self._quiet_max_age = quiet_max_age
        self._lock = threading.Lock()
        self._ts = float("-inf")  # monotonic start of the last listing
        self._pods: dict[str, _Listing] = {}
        self._changes = 0           # runtime changes reported (or possibly missed)
        self._listed_changes = -1   # ``_changes`` when the last listing started
        self._watched = False       # the event stream is live: no event means no change
        self.refreshes = 0

    def changed(self) -> None:
        """The runtime changed (a stream event, a lost one, the sync loop's own calls)."""
        self._changes += 1

    def watched(self, live: bool) -> None:
        """Whether the sync loop's own event stream is live."""
        if live != self._watched:
            self._changes += 1
            self._watched = live

    def _valid(self, newer_than: float, max_age: float) -> bool:
        age = self._mono() - self._ts
        if self._watched and self._listed_changes == self._changes \
                and age <= self._quiet_max_age:
            return True  # nothing changed since it started: as good as a new listing
        return self._ts >= newer_than and age <= max_age

    def pod(self, uid: str, newer_than: float, running_status: NeedStatus) -> PodRuntime:
        """The pod's runtime state from a listing started at or after ``newer_than``.
        Raises CriError when the runtime cannot be listed."""
        with self._lock:
            if not self._valid(newer_than, self._max_age):
                self._refresh()
            sandboxes, containers = self._pods.get(uid, ([], []))
        return pod_runtime(self._cri, sandboxes, containers, self._mono, self._wall,
                           running_status)

    def peek(self, uid: str, newer_than: float) -> _Listing | None:
        """The pod's part of the listing when ``pod(uid, newer_than, ...)`` would use it as is
        (no listing again), else None; never blocks on a refresh another thread is doing."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if not self._valid(newer_than, self._max_age):
                return None
            return self._pods.get(uid, ([], []))
        finally:
            self._lock.release()

    def pod_uids(self, max_age: float) -> tuple[set[str], float]:
        """Every pod UID of a listing at most ``max_age`` old (listing again otherwise), and
        when that listing started. Raises CriError."""
        with self._lock:
            if not self._valid(float("-inf"), max_age):
                self._refresh()
            return {uid for uid in self._pods if uid}, self._ts

    def _refresh(self) -> None:
        changes, started = self._changes, self._mono()
        pods: dict[str, _Listing] = {}
        for s in self._cri.list_pod_sandbox():
            pods.setdefault(s.labels.get(L.POD_UID, ""), ([], []))[0].append(s)
        for c in self._cri.list_containers():
            pods.setdefault(c.labels.get(L.POD_UID, ""), ([], []))[1].append(c)
        self._pods, self._ts, self._listed_changes = pods, started, changes
        self.refreshes += 1


class ImagePresence:
    """ImageStatus answers "present" remembered for ``ttl`` seconds: every container start with
    pull policy IfNotPresent/Never asked the runtime again (one call per start). An image
    removed meanwhile fails the create (CreateContainerError), and the retry after the error
    delay asks again. Absent images are never remembered. Thread-safe."""

    def __init__(self, cri: RuntimeClient, mono: Callable[[], float],
                 ttl: float = IMAGE_TTL) -> None:
        self._cri = cri
        self._mono = mono
        self._ttl = ttl
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}

    def present(self, image: str) -> bool:
        now = self._mono()
        with self._lock:
            if now - self._seen.get(image, float("-inf")) <= self._ttl:
                return True
        if self._cri.image_status(image) is None:
            return False
        with self._lock:
            self._seen[image] = now
        return True

    def forget(self, image: str) -> None:
        with self._lock:
            self._seen.pop(image, None)
