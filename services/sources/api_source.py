"""The API server source's state: this node's pods as the reflector last saw them, and the full
set made of them for the merge.

- ``listed``/``event`` (reflector thread) replace or change the raw objects (keyed by UID) and
  call ``wake`` so the main loop publishes; the main loop's ``take()`` returns the raw objects
  when something changed since the last call.
- ``build_set`` turns them into a ``SourceSet``: each pod validated with ``pod_from_dict`` (a
  bad pod is an error of the set naming ``api:<namespace>/<name>`` and the pod's UID, name
  and namespace, so the sync loop refuses it in its status; the others go on), its
  ``status`` dropped but for the conditions other controllers own (a readiness gate's) and a
  Failed phase with its reason and message (the agent's own status is the truth; its own
  writes would otherwise come back as merge updates), origin ``api``. Mirror pods (annotation
  ``kubernetes.io/config.mirror``) are recognised, listed apart in ``mirrors`` (the
  ``api-mirrors`` map's ``MirrorPod``s) and never run.
Parsed pods are cached by (UID, resourceVersion), so a relist of 110 pods parses none again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from podvisor.ipc.maps import MirrorPod
from podvisor.services.apiserver import ApiMeta
from podvisor.services.pod import Origin, Pod, PodValidationError, pod_from_dict
from podvisor.services.sources.common import SourceError, SourceSet

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
# metadata the agent uses; the server-set rest (resourceVersion, managedFields, owners...) is
# the API server's business and would only make warnings
_META_KEPT = ("name", "namespace", "uid", "labels", "annotations", "deletionTimestamp",
              "deletionGracePeriodSeconds")
Obj = dict[str, Any]


@dataclass(frozen=True)
class ApiSet:
    pods: SourceSet
    mirrors: tuple[MirrorPod, ...]


class ApiPodState:
    """Thread-safe holder of the raw pods (reflector thread in, main thread out)."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, Obj] = {}
        self._dirty = False
        self._synced = False
        self._wake = wake
        self._rv = ""
        self._changes = 0
        self.last_error = ""

    def resumed(self, items: list[Obj], rv: str) -> None:
        """Seed with a saved set and the version it stands for (published at once; the
        reflector watches on from ``rv``)."""
        self.listed(items, rv)

    def listed(self, items: list[Obj], rv: str) -> None:
        with self._lock:
            self._pods = {_uid(i): i for i in items if _uid(i)}
            self._dirty = self._synced = True
            self._rv = rv
            self._changes += 1
            self.last_error = ""
        self._wake()

    def event(self, kind: str, obj: Obj) -> None:
        rv = ApiMeta.of(obj).resource_version
        if kind == "BOOKMARK":  # the version moves on, the set does not change
            if rv:
                with self._lock:
                    self._rv = rv
                    self._changes += 1
            return
        uid = _uid(obj)
        if not uid:
            return
        with self._lock:
            if rv:
                self._rv = rv
            self._changes += 1
            if kind == "DELETED":
                self._pods.pop(uid, None)
            else:
                self._pods[uid] = obj
            self._dirty = True
        self._wake()

    def failed(self, why: str) -> None:
        with self._lock:
            self.last_error = why
        self._wake()

    def take(self) -> list[Obj] | None:
        """The raw pods when they changed since the last call (after the first list)."""
        with self._lock:
            if not (self._dirty and self._synced):
                return None
            self._dirty = False
            return list(self._pods.values())

    def snapshot(self) -> tuple[int, str, list[Obj]]:
        """(change count, resourceVersion, raw pods) taken together: the version stands for
        exactly that set, so it can be saved as a resume point."""
        with self._lock:
            return self._changes, self._rv, list(self._pods.values())


class SetBuilder:
    """Raw API pods -> ``ApiSet`` (cached per UID and resourceVersion)."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[str, Pod | SourceError]] = {}

    def build(self, raw: list[Obj]) -> ApiSet:
        pods: list[Pod] = []
        errors: list[SourceError] = []
        mirrors: list[MirrorPod] = []
        cache: dict[str, tuple[str, Pod | SourceError]] = {}
        for meta, obj in sorted(((ApiMeta.of(o), o) for o in raw),
                                key=lambda m: m[0].creation_timestamp):
            uid, rv = meta.uid, meta.resource_version
            if MIRROR_ANNOTATION in meta.annotations:
                mirrors.append(MirrorPod(meta.name, meta.namespace, uid,
                                         meta.annotations[MIRROR_ANNOTATION]))
                continue
            hit = self._cache.get(uid)
            result = hit[1] if hit is not None and hit[0] == rv else _parse(obj)
            cache[uid] = (rv, result)
            if isinstance(result, Pod):
                pods.append(result)
            else:
                errors.append(result)
        self._cache = cache
        return ApiSet(SourceSet("api", tuple(pods), tuple(errors)), tuple(mirrors))


def _parse(obj: Obj) -> Pod | SourceError:
    meta = obj.get("metadata") or {}
    where = f"api:{meta.get('namespace', '')}/{meta.get('name', '')}"
    body = {k: v for k, v in obj.items() if k != "status"}
    body["metadata"] = {k: meta[k] for k in _META_KEPT if k in meta}
    body.setdefault("kind", "Pod")
    body.setdefault("apiVersion", "v1")
    try:
        parsed = pod_from_dict(body, where, api_objects=True)
    except PodValidationError as exc:
        first = exc.errors[0] if exc.errors else None
        return SourceError(where, first.field if first else "",
                           "; ".join(f"{i.field}: {i.reason}" if i.field else i.reason
                                     for i in exc.errors) or "invalid pod",
                           uid=str(meta.get("uid") or ""), name=str(meta.get("name") or ""),
                           namespace=str(meta.get("namespace") or ""))
    pod = parsed.pod
    return Pod(pod.metadata, pod.spec, _foreign_status(obj.get("status")),
               Origin("api", where.removeprefix("api:"),
                      tuple(str(w) for w in parsed.warnings)))


# the conditions the kubelet writes itself (``PodConditionsByKubelet``)
_KUBELET_CONDITIONS = frozenset({"PodScheduled", "PodReadyToStartContainers", "Initialized",
                                 "ContainersReady", "Ready"})


def _foreign_status(status: Any) -> dict[str, Any]:
    """The part of an API pod's status the agent keeps: the conditions other controllers own
    (a readiness gate's), as the kubelet's status manager keeps them, and a Failed phase with
    its reason and message (terminal: the sync loop never runs such a pod again, as the
    kubelet's pod worker; syncloop ``_failed_in_api``); the rest is the agent's own, so its
    writes never come back as changes (a pod's turn to Failed comes back once)."""
    if not isinstance(status, dict):
        return {}
    out: dict[str, Any] = {}
    kept = [c for c in status.get("conditions") or [] if isinstance(c, dict)
            and c.get("type") not in _KUBELET_CONDITIONS]
    if kept:
        out["conditions"] = kept
    if status.get("phase") == "Failed":
        out.update((k, str(status.get(k) or "")) for k in ("phase", "reason", "message"))
    return out


def _uid(obj: Obj) -> str:
    return ApiMeta.of(obj).uid
