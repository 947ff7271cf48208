"""Statuses, mirror pods and deletions to the API server (the kubelet's status manager and
mirror client; KUBELET.md, "API server membership"). One ``turn`` works from a snapshot of the
agent's maps (``desired``, ``statuses``, and the API source's ``mirrors``) and from the API's
copy of each pod's status (``ApiCopies``, status-api's own watch):

1. Mirror pods: each static pod (source ``file``/``http``) has a mirror pod in the API with its
   spec, annotation ``kubernetes.io/config.mirror: <config hash>`` and the Node as controller
   owner; a mirror whose hash differs is DELETEd (grace 0, UID precondition) and created again;
   a mirror without a static pod is DELETEd.
2. Statuses: a pod whose status ``version`` advanced past the version last written is
   strategic-merge-PATCHed on ``pods/<name>/status`` (``reconcile.status_patch``) with
   ``metadata.uid`` as a precondition (an API pod: its own UID; a static pod: its mirror's).
   A ``reconcile`` turn (status-api's sweep, and the first after every list: the kubelet's
   ``syncBatch(all)``) also writes every pod whose copy in the API differs from podvisor's
   status (``reconcile.differences``: another client changed it, or it changed while the
   API server was away): as the kubelet's ``syncPod``, it GETs the pod first (the watch's
   copy may predate podvisor's own last write) and PATCHes only if that still differs. A
   copy no newer than podvisor's last write or read of the pod is not compared (the watch
   brings that write back, or something after it). ``404`` (gone) and ``409`` (a different
   pod now has the name) drop that target for good; an unreachable server leaves everything
   pending, so the newest status of each pod reaches the API when it is back. A copy in a
   terminal phase that podvisor's status is not in is left alone (the API server refuses the
   transition; logged once).
3. Deletion: an API pod with ``deletionTimestamp`` whose worker is ``terminated`` (its
   containers are gone; its final status was written in step 2) is DELETEd with grace 0 and a
   UID precondition.
``ApiUnreachable`` ends the turn at once (the caller backs off); an ``ApiError`` concerns one
pod and never stops the others. ``back()`` forgets what only held while the API server was
away (mirror creations not seen yet, the Node's UID, the terminal-phase notes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from podvisor.ipc.maps import DesiredPod, DesiredValue, MirrorPod, PodStatusValue
from podvisor.services.apiserver import STRATEGIC_MERGE_PATCH, ApiConnection, ApiError, ApiMeta
from podvisor.services.pod import (
    CONFIG_HASH_ANNOTATION,
    CONFIG_MIRROR_ANNOTATION,
    Pod,
    PodValidationError,
    WirePods,
)
from podvisor.services.status.apicopy import ApiCopies
from podvisor.services.status.reconcile import differences, status_patch, terminal_in_api

Obj = dict[str, Any]
MIRROR = CONFIG_MIRROR_ANNOTATION
HASH = CONFIG_HASH_ANNOTATION
STATIC_SOURCES = ("file", "http")


@dataclass(frozen=True)
class Snapshot:
    desired: Mapping[str, DesiredValue]
    statuses: Mapping[str, PodStatusValue]
    mirrors: Sequence[MirrorPod] | None  # None until the API source published its first set
    api_pods: Sequence[Mapping[str, Any]] | None = None  # the API source's set (wire forms)


@dataclass
class StatusWriter:
    conn: ApiConnection
    node: str
    log: Any
    written: dict[str, int] = field(default_factory=dict)  # target UID -> version written
    dropped: set[str] = field(default_factory=set)  # target UIDs the API refused for good
    deleted: set[str] = field(default_factory=set)
    creating: dict[tuple[str, str], str] = field(default_factory=dict)  # (ns, name) -> hash
    node_uid: str = ""
    counters: dict[str, int] = field(default_factory=lambda: {
        "patches": 0, "reconciles": 0, "mirror_creates": 0, "mirror_deletes": 0,
        "deletes": 0})
    pods: WirePods = field(default_factory=WirePods)  # the typed pod of each desired entry
    copies: ApiCopies = field(default_factory=ApiCopies)  # the API's statuses (its watch)
    patched: dict[str, int] = field(default_factory=dict)  # target UID -> copies.seq before
    terminal: set[str] = field(default_factory=set)  # targets terminal in the API (logged)

    def _pod(self, uid: str, entry: DesiredPod) -> Pod | None:
        """``entry``'s typed pod (None for one that is not a validated wire form: the status
        process logs it)."""
        try:
            return self.pods.get(uid, entry.pod)
        except PodValidationError:
            return None

    def pending(self, snap: Snapshot) -> int:
        """Statuses not yet in the API (for logs and tests)."""
        return sum(1 for _, target, version in self._targets(snap)
                   if target and self.written.get(target[2]) != version)

    def turn(self, snap: Snapshot, reconcile: bool = False) -> None:
        """Mirrors, statuses whose version advanced (with ``reconcile``: and those whose copy
        in the API differs), deletions."""
        self.pods.retain(snap.desired.keys())
        if snap.mirrors is not None:
            self._mirrors(snap)
        for uid, target, version in self._targets(snap):
            if target is None or target[2] in self.dropped:
                continue
            status = snap.statuses[uid]
            if self.written.get(target[2]) != version:
                self._patch(uid, target, status, version)
            elif reconcile and self._differs(uid, target, status):
                self._reconcile(uid, target, status, version)
        self._deletions(snap)

    def back(self) -> None:
        """The API server answers again (status-api's watch listed): forget what waited on
        the outage. Every copy is newer than any write after a list, so each pod is compared
        again at once."""
        self.creating.clear()
        self.node_uid = ""
        self.terminal.clear()

    # -- statuses -------------------------------------------------------------------------------
    def _targets(self, snap: Snapshot) -> list[tuple[str, tuple[str, str, str] | None, int]]:
        mirrors = {(m.namespace, m.name): m for m in snap.mirrors or ()}
        out = []
        for uid, status in snap.statuses.items():
            entry = snap.desired.get(uid)
            if not isinstance(entry, DesiredPod) or (pod := self._pod(uid, entry)) is None:
                continue
            ns, name = pod.namespace, pod.name
            target: tuple[str, str, str] | None = None
            if entry.source == "api":
                target = (ns, name, uid)
            elif entry.source in STATIC_SOURCES:
                mirror = mirrors.get((ns, name))
                if mirror is not None and mirror.hash == pod.metadata.annotations.get(HASH):
                    target = (ns, name, mirror.uid)
            out.append((uid, target, status.version))
        return out

    def _differs(self, uid: str, target: tuple[str, str, str],
                 status: PodStatusValue) -> list[str]:
        """What of the API's copy of ``target`` differs from ``status`` (nothing while no copy
        newer than podvisor's last write or read of it has come)."""
        copy = self.copies.get(target[2])
        if copy is None or copy.seq <= self.patched.get(target[2], 0):
            return []
        return self._compare(uid, target, copy.status, status)

    def _compare(self, uid: str, target: tuple[str, str, str], api: Mapping[str, Any],
                 status: PodStatusValue) -> list[str]:
        ns, name, target_uid = target
        if terminal_in_api(api, status.status):
            if target_uid not in self.terminal:
                self.terminal.add(target_uid)
                self.log.warning("status.api.terminal_in_api", pod=f"{name}_{ns}",
                                 pod_uid=uid, phase=str(api.get("phase")),
                                 reason="the API server refuses to leave a terminal phase")
            return []
        return differences(api, status.status)

    def _reconcile(self, uid: str, target: tuple[str, str, str], status: PodStatusValue,
                   version: int) -> None:
        """The kubelet's ``syncPod`` after ``needsReconcile``: the pod read afresh (the watch's
        copy may predate podvisor's last write: a list served while it wrote), then PATCHed
        if it still differs; if not, that copy is not compared again."""
        ns, name, target_uid = target
        before = self.copies.seq
        try:
            pod = self.conn.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
        except ApiError as exc:
            self._failed(uid, target, exc, "status.api.get_failed")
            return
        if ApiMeta.of(pod).uid != target_uid:
            self._failed(uid, target, ApiError(409, "Conflict", "deleted and created again"),
                         "status.api.get_failed")
            return
        fresh = pod.get("status")
        fresh = fresh if isinstance(fresh, Mapping) else {}
        differs = self._compare(uid, target, fresh, status)
        if not differs:
            self.patched[target_uid] = before
            return
        self.counters["reconciles"] += 1
        self._patch(uid, target, status, version, differs, fresh)

    def _failed(self, uid: str, target: tuple[str, str, str], exc: ApiError,
                event: str) -> None:
        """``404`` (gone) and ``409`` (another pod has the name) drop the target for good;
        anything else is tried again next turn."""
        ns, name, target_uid = target
        if exc.status in (404, 409):
            self.dropped.add(target_uid)
            self.log.info("status.api.dropped", pod=f"{name}_{ns}", pod_uid=uid,
                          target_uid=target_uid, reason=str(exc))
        else:
            self.log.warning(event, pod=f"{name}_{ns}", pod_uid=uid, reason=str(exc))

    def _patch(self, uid: str, target: tuple[str, str, str], status: PodStatusValue,
               version: int, differs: list[str] | None = None,
               api: Mapping[str, Any] | None = None) -> None:
        """PATCH ``status`` over ``api`` (the API's status, default: the watch's copy)."""
        ns, name, target_uid = target
        if api is None:
            copy = self.copies.get(target_uid)
            api = copy.status if copy is not None else None
        before = self.copies.seq  # a copy delivered after this may hold the write
        body = {"metadata": {"uid": target_uid}, "status": status_patch(status.status, api)}
        try:
            self.conn.request("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status",
                              body=body, content_type=STRATEGIC_MERGE_PATCH)
        except ApiError as exc:
            self._failed(uid, target, exc, "status.api.patch_failed")
            return
        self.written[target_uid] = version
        self.patched[target_uid] = before
        self.counters["patches"] += 1
        if differs:
            self.log.info("status.api.reconciled", pod=f"{name}_{ns}", pod_uid=uid,
                          target_uid=target_uid, differed=differs)

    # -- deletion -------------------------------------------------------------------------------
    def _deletions(self, snap: Snapshot) -> None:
        for api_pod in snap.api_pods or ():
            meta = ApiMeta.of(api_pod)
            uid = meta.uid
            if not meta.deletion_timestamp or not uid or uid in self.deleted:
                continue
            entry = snap.desired.get(uid)
            status = snap.statuses.get(uid)
            if isinstance(entry, DesiredPod):
                if entry.active:
                    continue  # still being killed (a pod never admitted has nothing to kill)
            elif status is not None and any(
                    cs.state.running is not None for cs in status.status.container_statuses):
                continue  # not (yet) in ``desired`` but known to run: wait
            if status is not None and uid not in self.dropped and \
                    self.written.get(uid) != status.version:
                continue  # the final status goes first
            ns, name = meta.namespace, meta.name
            try:
                self.conn.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}",
                                  body={"apiVersion": "v1", "kind": "DeleteOptions",
                                        "gracePeriodSeconds": 0,
                                        "preconditions": {"uid": uid}})
            except ApiError as exc:
                if exc.status not in (404, 409):
                    self.log.warning("status.api.delete_failed", pod=f"{name}_{ns}",
                                     pod_uid=uid, reason=str(exc))
                    continue
            self.deleted.add(uid)
            self.counters["deletes"] += 1
            self.log.info("status.api.deleted", pod=f"{name}_{ns}", pod_uid=uid)

    # -- mirror pods ----------------------------------------------------------------------------
    def _mirrors(self, snap: Snapshot) -> None:
        wanted: dict[tuple[str, str], tuple[Pod, str]] = {}  # -> (pod, its config hash)
        for uid, entry in snap.desired.items():
            if not isinstance(entry, DesiredPod) or entry.source not in STATIC_SOURCES or \
                    entry.worker == "terminated" or (pod := self._pod(uid, entry)) is None:
                continue
            if want := pod.metadata.annotations.get(HASH):
                wanted[(pod.namespace, pod.name)] = (pod, want)
        existing = {(m.namespace, m.name): m for m in snap.mirrors or ()}
        for key, mirror in existing.items():
            hit = wanted.get(key)
            if (hit[1] if hit is not None else None) != mirror.hash:
                self._delete_mirror(key, mirror.uid)
        for key in [k for k in self.creating if k in existing and
                    existing[k].hash == self.creating[k]]:
            del self.creating[key]  # the API source saw it
        for key, (pod, want_hash) in wanted.items():
            current = existing.get(key)
            if (current is not None and current.hash == want_hash) or \
                    self.creating.get(key) == want_hash:
                continue
            self._create_mirror(key, pod, want_hash)

    def _delete_mirror(self, key: tuple[str, str], uid: str) -> None:
        ns, name = key
        try:
            self.conn.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}",
                              body={"apiVersion": "v1", "kind": "DeleteOptions",
                                    "gracePeriodSeconds": 0, "preconditions": {"uid": uid}})
        except ApiError as exc:
            if exc.status not in (404, 409):
                self.log.warning("status.mirror.delete_failed", pod=f"{name}_{ns}",
                                 reason=str(exc))
                return
        self.creating.pop(key, None)
        self.counters["mirror_deletes"] += 1
        self.log.info("status.mirror.deleted", pod=f"{name}_{ns}", mirror_uid=uid)

    def _create_mirror(self, key: tuple[str, str], pod: Pod, config_hash: str) -> None:
        ns, name = key
        if not self.node_uid:
            try:
                node = self.conn.request("GET", f"/api/v1/nodes/{self.node}")
            except ApiError as exc:
                self.log.info("status.mirror.waiting_for_node", pod=f"{name}_{ns}",
                              reason=str(exc))
                return
            self.node_uid = ApiMeta.of(node).uid
        meta = pod.metadata
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": ns, "labels": dict(meta.labels),
            "annotations": {**meta.annotations, MIRROR: config_hash},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.node,
                                 "uid": self.node_uid, "controller": True}]},
            "spec": {**pod.spec.to_dict(), "nodeName": self.node}}
        try:
            self.conn.request("POST", f"/api/v1/namespaces/{ns}/pods", body=body)
        except ApiError as exc:
            if exc.status != 409:
                self.log.warning("status.mirror.create_failed", pod=f"{name}_{ns}",
                                 reason=str(exc))
                return
        self.creating[key] = config_hash
        self.counters["mirror_creates"] += 1
        self.log.info("status.mirror.created", pod=f"{name}_{ns}", hash=config_hash)
