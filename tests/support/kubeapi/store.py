"""The stand-in API server's storage: objects, one resourceVersion counter, watch history.

Semantics follow kube-apiserver's generic registry and watch cache (k8s.io/apiserver):
- one cluster-wide, strictly increasing ``resourceVersion`` stamped on every write;
- a bounded event history (``window`` events; ``compact()`` drops it all): a watch from a
  version older than the oldest kept event gets a ``410 Gone`` ("Expired") ERROR event;
- a watch without a version (or ``"0"``) first sends ADDED for every current match;
- a watch with a selector sees an object leave its selection as DELETED and enter it as ADDED;
- updates carry ``resourceVersion`` as an optimistic lock (409 Conflict), and a ``metadata.uid``
  that differs from the stored object's is a failed precondition (409 Conflict);
- pods: ``status`` is written only through ``pods/status`` (and ``spec`` never through it);
  graceful deletion sets ``deletionTimestamp`` + ``deletionGracePeriodSeconds`` (a later delete
  may only shorten it), and grace 0, an unscheduled pod or a terminal phase deletes at once;
- objects with ``finalizers`` stay (with ``deletionTimestamp``) until the last one is removed.
Thread-safe: every method takes the store's lock; watchers are called under it, in order.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str]  # resource, namespace ("" when cluster-scoped), name


class ApiError(Exception):
    """An API error answered as a ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> Obj:
        out: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            out["details"] = self.details
        return out


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource} "{name}" not found',
                    {"name": name, "kind": resource})


def conflict(resource: str, name: str, why: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": {why}',
                    {"name": name, "kind": resource})


OPTIMISTIC_LOCK = ("the object has been modified; please apply your changes to the latest "
                   "version and try again")


def now_rfc3339(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Event:
    rv: int
    type: str  # ADDED MODIFIED DELETED
    key: Key
    obj: Obj
    old: Obj | None


Watcher = Callable[[Event], None]

# resource -> (kind, apiVersion, namespaced, has status subresource, unconditional update allowed)
KINDS: dict[str, tuple[str, str, bool, bool, bool]] = {
    "pods": ("Pod", "v1", True, True, True),
    "nodes": ("Node", "v1", False, True, True),
    "namespaces": ("Namespace", "v1", False, True, True),
    "configmaps": ("ConfigMap", "v1", True, False, True),
    "secrets": ("Secret", "v1", True, False, True),
    "serviceaccounts": ("ServiceAccount", "v1", True, False, True),
    "events": ("Event", "v1", True, False, True),
    "leases": ("Lease", "coordination.k8s.io/v1", True, False, False),
    "certificatesigningrequests": ("CertificateSigningRequest", "certificates.k8s.io/v1", False,
                                   False, True),
    "clusterrolebindings": ("ClusterRoleBinding", "rbac.authorization.k8s.io/v1", False, False,
                            True),
    "clusterroles": ("ClusterRole", "rbac.authorization.k8s.io/v1", False, False, True),
    # issue 25: volumes (the controllers that act on them: tests/support/kubeapi/volumes.py)
    "persistentvolumes": ("PersistentVolume", "v1", False, True, True),
    "persistentvolumeclaims": ("PersistentVolumeClaim", "v1", True, True, True),
    "storageclasses": ("StorageClass", "storage.k8s.io/v1", False, False, True),
    "csidrivers": ("CSIDriver", "storage.k8s.io/v1", False, False, True),
    "csinodes": ("CSINode", "storage.k8s.io/v1", False, False, True),
    "volumeattachments": ("VolumeAttachment", "storage.k8s.io/v1", False, True, True),
    # issue 24: the kubelet's RuntimeClass manager watches them (validate_runtime_class)
    "runtimeclasses": ("RuntimeClass", "node.k8s.io/v1", False, False, True),
}
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def validate_runtime_class(obj: Obj, old: Obj | None) -> None:
    """node/validation ``ValidateRuntimeClass``: ``handler`` a DNS-1123 label (so required);
    ``ValidateRuntimeClassUpdate``: ``handler`` immutable."""
    name = obj.get("metadata", {}).get("name", "")
    handler = obj.get("handler", "")
    where = f'RuntimeClass.node.k8s.io "{name}" is invalid: handler: Invalid value: "{handler}"'
    if not isinstance(handler, str) or len(handler) > 63 or not _DNS_LABEL.fullmatch(handler):
        raise ApiError(422, "Invalid", f"{where}: a lowercase RFC 1123 label must consist of "
                       "lower case alphanumeric characters or '-', and must start and end with "
                       "an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used "
                       "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
    if old is not None and handler != old.get("handler"):
        raise ApiError(422, "Invalid", f"{where}: field is immutable")
TERMINAL = ("Succeeded", "Failed")


@dataclass
class Store:
    wall: Callable[[], float]
    window: int = 1000
    rv: int = 1
    objects: dict[Key, Obj] = field(default_factory=dict)
    history: deque[Event] = field(default_factory=deque)
    oldest: int = 1  # the oldest version a watch may resume from
    watchers: list[Watcher] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)

    # -- reads --------------------------------------------------------------------------------
    def get(self, resource: str, ns: str, name: str) -> Obj:
        with self.lock:
            obj = self.objects.get((resource, ns, name))
            if obj is None:
                raise not_found(resource, name)
            return copy.deepcopy(obj)

    def list(self, resource: str, ns: str | None) -> tuple[list[Obj], int]:
        with self.lock:
            items = [copy.deepcopy(o) for (r, n, _), o in sorted(self.objects.items())
                     if r == resource and (ns is None or n == ns)]
            return items, self.rv

    def since(self, rv: int) -> list[Event]:
        """Events after ``rv``; ApiError 410 when ``rv`` is older than the history kept."""
        with self.lock:
            if rv < self.oldest:
                raise ApiError(410, "Expired",
                               f"too old resource version: {rv} ({self.oldest})")
            return [e for e in self.history if e.rv > rv]

    def compact(self) -> None:
        """Drop the whole event history (as etcd compaction does): older versions expire."""
        with self.lock:
            self.history.clear()
            self.oldest = self.rv

    # -- writes -------------------------------------------------------------------------------
    def _commit(self, etype: str, key: Key, obj: Obj | None, old: Obj | None) -> Obj:
        self.rv += 1
        if obj is not None:
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.objects[key] = obj
            shown = obj
        else:
            self.objects.pop(key, None)
            assert old is not None
            shown = copy.deepcopy(old)
            shown["metadata"]["resourceVersion"] = str(self.rv)
        event = Event(self.rv, etype, key, copy.deepcopy(shown),
                      copy.deepcopy(old) if old is not None else None)
        self.history.append(event)
        while len(self.history) > self.window:
            dropped = self.history.popleft()
            self.oldest = dropped.rv
        for watcher in list(self.watchers):
            watcher(event)
        return copy.deepcopy(shown)

    def create(self, resource: str, ns: str, obj: Obj) -> Obj:
        kind, api_version, namespaced, _, _ = KINDS[resource]
        with self.lock:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            if meta.get("resourceVersion"):
                raise ApiError(500, "InternalError",
                               "resourceVersion should not be set on objects to be created")
            if namespaced:
                if meta.get("namespace") not in (None, "", ns):
                    raise ApiError(400, "BadRequest", "the namespace of the provided object "
                                   "does not match the namespace sent on the request")
                meta["namespace"] = ns
                if ("namespaces", "", ns) not in self.objects:
                    raise not_found("namespaces", ns)
            if not meta.get("name"):
                if meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                else:
                    raise ApiError(422, "Invalid", f"{kind} is invalid: metadata.name: "
                                   "Required value: name or generateName is required")
            key = (resource, ns if namespaced else "", meta["name"])
            if key in self.objects:
                raise ApiError(409, "AlreadyExists",
                               f'{resource} "{meta["name"]}" already exists',
                               {"name": meta["name"], "kind": resource})
            obj["kind"] = kind
            obj["apiVersion"] = api_version
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_rfc3339(self.wall())
            meta.pop("deletionTimestamp", None)
            meta.pop("deletionGracePeriodSeconds", None)
            meta["generation"] = 1
            if resource == "pods":
                obj.setdefault("spec", {}).setdefault("terminationGracePeriodSeconds", 30)
                obj["status"] = {"phase": "Pending", **(obj.get("status") or {})} \
                    if obj.get("status") else {"phase": "Pending"}
            if resource == "namespaces":
                obj.setdefault("status", {"phase": "Active"})
            if resource in ("persistentvolumes", "persistentvolumeclaims"):
                obj["status"] = {"phase": "Pending"}  # the PV controller moves it on
                if resource == "persistentvolumes":
                    obj.setdefault("spec", {}).setdefault("persistentVolumeReclaimPolicy",
                                                          "Retain")
                else:
                    obj.setdefault("spec", {}).setdefault("volumeMode", "Filesystem")
            if resource == "csidrivers":  # the API's defaults (storage/v1 SetDefaults_CSIDriver)
                spec = obj.setdefault("spec", {})
                spec.setdefault("attachRequired", True)
                spec.setdefault("podInfoOnMount", False)
                spec.setdefault("fsGroupPolicy", "ReadWriteOnceWithFSType")
                spec.setdefault("volumeLifecycleModes", ["Persistent"])
                spec.setdefault("requiresRepublish", False)
                spec.setdefault("storageCapacity", False)
            if resource == "runtimeclasses":
                validate_runtime_class(obj, None)
            if resource == "secrets" and "stringData" in obj:  # as the registry merges it
                data = obj.setdefault("data", {})
                for k, v in (obj.pop("stringData") or {}).items():
                    data[k] = base64.b64encode(str(v).encode()).decode()
            return self._commit("ADDED", key, obj, None)

    def update(self, resource: str, ns: str, name: str, mutate: Callable[[Obj], Obj],
               *, subresource: str = "", unconditional_ok: bool = True) -> Obj:
        """Apply ``mutate`` to the stored object (a PUT body, or a patch applied to it) and
        store it: resourceVersion / uid checks, status vs main resource split, finalizers."""
        kind, _, namespaced, has_status, allow_unconditional = KINDS[resource]
        with self.lock:
            key = (resource, ns if namespaced else "", name)
            old = self.objects.get(key)
            if old is None:
                raise not_found(resource, name)
            new = mutate(copy.deepcopy(old))
            meta = new.setdefault("metadata", {})
            if meta.get("name", name) != name:
                raise ApiError(400, "BadRequest", "the name of the object "
                               f"({meta.get('name')}) does not match the name on the URL "
                               f"({name})")
            uid = meta.get("uid")
            if uid and uid != old["metadata"]["uid"]:
                raise conflict(resource, name, f"Precondition failed: UID in precondition: "
                               f"{uid}, UID in object meta: {old['metadata']['uid']}")
            rv = meta.get("resourceVersion")
            if rv:
                if rv != old["metadata"]["resourceVersion"]:
                    raise conflict(resource, name, OPTIMISTIC_LOCK)
            elif not (allow_unconditional and unconditional_ok):
                raise ApiError(422, "Invalid", f'{kind} "{name}" is invalid: '
                               "metadata.resourceVersion: Invalid value: 0x0: must be "
                               "specified for an update")
            # fields the server owns
            for owned in ("uid", "creationTimestamp", "deletionTimestamp",
                          "deletionGracePeriodSeconds", "generation"):
                if owned in old["metadata"]:
                    meta[owned] = old["metadata"][owned]
                else:
                    meta.pop(owned, None)
            meta["name"] = name
            if namespaced:
                meta["namespace"] = ns
            new["kind"] = kind
            new["apiVersion"] = old["apiVersion"]
            if has_status:
                if subresource == "status":
                    new["spec"] = copy.deepcopy(old.get("spec"))
                    new["metadata"] = {**copy.deepcopy(old["metadata"]),
                                       "labels": meta.get("labels", old["metadata"].get(
                                           "labels")),
                                       "annotations": meta.get("annotations", old["metadata"]
                                                               .get("annotations"))}
                    for k in ("labels", "annotations"):
                        if new["metadata"][k] is None:
                            del new["metadata"][k]
                    if resource == "pods" and old.get("status", {}).get("phase") in TERMINAL \
                            and new.get("status", {}).get("phase") not in TERMINAL:
                        raise ApiError(422, "Invalid", f'Pod "{name}" is invalid: status.phase:'
                                       " Forbidden: may not be transitioned from a terminal "
                                       "phase")
                else:
                    if "status" in old:
                        new["status"] = copy.deepcopy(old["status"])
                    else:
                        new.pop("status", None)
            if resource == "runtimeclasses":
                validate_runtime_class(new, old)
            if new.get("spec") != old.get("spec"):
                meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
            if old["metadata"].get("deletionTimestamp") and not meta.get("finalizers") \
                    and not self._graceful_pending(resource, old):
                return self._commit("DELETED", key, None, old)
            if _same(new, old):
                return copy.deepcopy(old)  # a no-op write does not bump the version
            return self._commit("MODIFIED", key, new, old)

    @staticmethod
    def _graceful_pending(resource: str, obj: Obj) -> bool:
        return resource == "pods" and int(
            obj["metadata"].get("deletionGracePeriodSeconds") or 0) > 0

    def delete(self, resource: str, ns: str, name: str, *, grace: int | None = None,
               uid: str | None = None, rv: str | None = None) -> Obj:
        _, _, namespaced, _, _ = KINDS[resource]
        with self.lock:
            key = (resource, ns if namespaced else "", name)
            old = self.objects.get(key)
            if old is None:
                raise not_found(resource, name)
            meta = old["metadata"]
            if uid is not None and uid != meta["uid"]:
                raise conflict(resource, name, f"Precondition failed: UID in precondition: "
                               f"{uid}, UID in object meta: {meta['uid']}")
            if rv is not None and rv != meta["resourceVersion"]:
                raise conflict(resource, name, "Precondition failed: ResourceVersion in "
                               f"precondition: {rv}, ResourceVersion in object meta: "
                               f"{meta['resourceVersion']}")
            if resource == "pods":
                if grace is None:
                    grace = int(old.get("spec", {}).get("terminationGracePeriodSeconds", 30))
                if not old.get("spec", {}).get("nodeName") or \
                        old.get("status", {}).get("phase") in TERMINAL:
                    grace = 0  # the pod strategy: nothing runs it, delete at once
            else:
                grace = 0
            finalizers = bool(meta.get("finalizers"))
            if grace > 0 or finalizers:
                current = meta.get("deletionGracePeriodSeconds")
                if meta.get("deletionTimestamp") and current is not None and \
                        int(current) <= grace:
                    return copy.deepcopy(old)  # a delete may only shorten the grace period
                new = copy.deepcopy(old)
                new["metadata"]["deletionTimestamp"] = now_rfc3339(self.wall() + grace)
                new["metadata"]["deletionGracePeriodSeconds"] = grace
                if grace == 0 and not finalizers:
                    return self._commit("DELETED", key, None, old)
                return self._commit("MODIFIED", key, new, old)
            return self._commit("DELETED", key, None, old)


def _same(a: Obj, b: Obj) -> bool:
    strip = ("resourceVersion",)
    ma = {k: v for k, v in a["metadata"].items() if k not in strip}
    mb = {k: v for k, v in b["metadata"].items() if k not in strip}
    return ma == mb and {k: v for k, v in a.items() if k != "metadata"} == \
        {k: v for k, v in b.items() if k != "metadata"}
