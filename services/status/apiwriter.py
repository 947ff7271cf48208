"""Statuses, mirror pods and deletions to the API server (the kubelet's status manager and
mirror client; KUBELET.md, "API server membership"). One ``turn`` works from a snapshot of the
agent's maps (``desired``, ``statuses``, and the API source's ``mirrors``):

1. Mirror pods: each static pod (source ``file``/``http``) has a mirror pod in the API with its
   spec, annotation ``kubernetes.io/config.mirror: <config hash>`` and the Node as controller
   owner; a mirror whose hash differs is DELETEd (grace 0, UID precondition) and created again;
   a mirror without a static pod is DELETEd.
2. Statuses: a pod whose status ``version`` advanced past the version last written is
   merge-PATCHed on ``pods/<name>/status`` with ``metadata.uid`` as a precondition (an API pod:
   its own UID; a static pod: its mirror's). ``404`` (gone) and ``409`` (a different pod now
   has the name) drop that target for good; an unreachable server leaves everything pending,
   so the newest status of each pod reaches the API when it is back.
3. Deletion: an API pod with ``deletionTimestamp`` whose worker is ``terminated`` (its
   containers are gone; its final status was written in step 2) is DELETEd with grace 0 and a
   UID precondition.
``ApiUnreachable`` ends the turn at once (the caller backs off); an ``ApiError`` concerns one
pod and never stops the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from podvisor.ipc.maps import DesiredPod, DesiredValue, MirrorPod, PodStatusValue
from podvisor.services.apiserver import MERGE_PATCH, ApiConnection, ApiError, ApiMeta
from podvisor.services.pod import (
    CONFIG_HASH_ANNOTATION,
    CONFIG_MIRROR_ANNOTATION,
    Pod,
    PodValidationError,
    WirePods,
)

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
        "patches": 0, "mirror_creates": 0, "mirror_deletes": 0, "deletes": 0})
    pods: WirePods = field(default_factory=WirePods)  # the typed pod of each desired entry

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

    def turn(self, snap: Snapshot) -> None:
        self.pods.retain(snap.desired.keys())
        if snap.mirrors is not None:
            self._mirrors(snap)
        for uid, target, version in self._targets(snap):
            if target is None or target[2] in self.dropped or \
                    self.written.get(target[2]) == version:
                continue
            self._patch(uid, target, snap.statuses[uid], version)
        self._deletions(snap)

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

    def _patch(self, uid: str, target: tuple[str, str, str], status: PodStatusValue,
               version: int) -> None:
        ns, name, target_uid = target
        body = {"metadata": {"uid": target_uid},
                "status": status.status.to_dict()}
        try:
            self.conn.request("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status",
                              body=body, content_type=MERGE_PATCH)
        except ApiError as exc:
            if exc.status in (404, 409):
                self.dropped.add(target_uid)
                self.log.info("status.api.dropped", pod=f"{name}_{ns}", pod_uid=uid,
                              target_uid=target_uid, reason=str(exc))
            else:
                self.log.warning("status.api.patch_failed", pod=f"{name}_{ns}", pod_uid=uid,
                                 reason=str(exc))
            return
        self.written[target_uid] = version
        self.counters["patches"] += 1

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
