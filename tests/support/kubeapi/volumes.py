"""kube-controller-manager's volume controllers, played for the stand-in API server's tests
(issue 25), as far as podvisor's tests need them, writing kube-apiserver's documented object
shapes:

- the PV controller's binding: a Pending claim is bound to the PV it names
  (``spec.volumeName``) or to an Available PV of its storage class whose access modes and
  capacity fit (the smallest); both sides written as the controller does (PV
  ``spec.claimRef`` + phase Bound, claim ``spec.volumeName`` + ``status`` phase Bound,
  ``accessModes``, ``capacity``; the ``pv.kubernetes.io/bind-completed`` and
  ``bound-by-controller`` annotations); a new PV becomes Available;
- dynamic provisioning: a claim of a class a test registers (``provisioners[class]``: claim ->
  PV spec) gets a PV ``pvc-<claim uid>`` pre-bound to it, reclaim policy from the class;
- reclaim: a claim deleted: its PV is deleted (``Delete``, the provisioner's ``deleted`` hook
  told) or Released (``Retain``);
- the ephemeral-volume controller: a pod's ``ephemeral`` volume gets the claim
  ``<pod>-<volume>`` from its template, controlled by the pod;
- the garbage collector: a claim whose controlling pod is gone is deleted;
- an external attacher (``attach``: VolumeAttachment -> (attached, error)), off by default.
One thread reacts to the store's events in order (``start``/``stop``); a test waits on the
objects (``wait_for``), never on the thread.
"""

from __future__ import annotations

import contextlib
import copy
import queue
import threading
from collections.abc import Callable
from typing import Any

from tests.support.kubeapi.server import KubeApi
from tests.support.kubeapi.store import ApiError, Event, Obj

GI = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "M": 10**6,
      "G": 10**9, "T": 10**12}


def quantity(text: Any) -> int:
    text = str(text)
    for suffix, factor in sorted(GI.items(), key=lambda kv: -len(kv[0])):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(float(text))


class VolumeControllers:
    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.store = api.store
        self.provisioners: dict[str, Callable[[Obj], Obj]] = {}
        self.deleted: list[str] = []  # PVs the reclaim deleted
        self.attach: Callable[[Obj], tuple[bool, str]] | None = None
        self._queue: queue.SimpleQueue[Event | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="volume-controllers",
                                        daemon=True)

    def start(self) -> VolumeControllers:
        self.store.watchers.append(self._queue.put)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._queue.put in self.store.watchers:
            self.store.watchers.remove(self._queue.put)
        self._queue.put(None)
        self._thread.join(10)

    def _run(self) -> None:
        while (event := self._queue.get()) is not None:
            with contextlib.suppress(ApiError):  # a conflict or a gone object: the next
                self._handle(event)  # event tries again

    # -- dispatch ------------------------------------------------------------------------------
    def _handle(self, event: Event) -> None:
        resource, ns, name = event.key
        if resource == "persistentvolumes" and event.type == "ADDED":
            if event.obj.get("status", {}).get("phase") == "Pending":
                self._set_pv_phase(name, "Bound" if event.obj["spec"].get("claimRef")
                                   else "Available")
            self._bind_pending()
        elif resource == "persistentvolumeclaims" and event.type in ("ADDED", "MODIFIED"):
            if event.obj.get("status", {}).get("phase") == "Pending":
                self._bind(event.obj)
        elif resource == "persistentvolumeclaims" and event.type == "DELETED":
            self._reclaim(event.obj)
        elif resource == "pods" and event.type == "ADDED":
            self._ephemeral(event.obj)
        elif resource == "pods" and event.type == "DELETED":
            self._collect(ns, event.obj["metadata"]["uid"])
        elif resource == "volumeattachments" and event.type in ("ADDED", "MODIFIED") and \
                self.attach is not None and not event.obj.get("status", {}).get("attached"):
            attached, error = self.attach(event.obj)
            status: Obj = {"attached": attached}
            if error:
                status["attachError"] = {"message": error, "time": "2026-01-01T00:00:00Z"}
            self.store.update("volumeattachments", "", name,
                              lambda va: {**va, "status": status}, subresource="status")

    # -- binding -------------------------------------------------------------------------------
    def _set_pv_phase(self, name: str, phase: str) -> None:
        self.store.update("persistentvolumes", "", name,
                          lambda pv: {**pv, "status": {"phase": phase}}, subresource="status")

    def _bind_pending(self) -> None:
        claims, _ = self.store.list("persistentvolumeclaims", None)
        for claim in claims:
            if claim.get("status", {}).get("phase") == "Pending":
                self._bind(claim)

    def _bind(self, claim: Obj) -> None:
        spec = claim.get("spec", {})
        pv = self._find(claim)
        if pv is None:
            cls = spec.get("storageClassName") or ""
            if cls in self.provisioners and not spec.get("volumeName"):
                pv = self._provision(claim, cls)
            if pv is None:
                return
        meta = claim["metadata"]
        ref = {"kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
               "name": meta["name"], "uid": meta["uid"], "apiVersion": "v1",
               "resourceVersion": meta["resourceVersion"]}
        pv_name = pv["metadata"]["name"]

        def bind_pv(obj: Obj) -> Obj:
            obj = copy.deepcopy(obj)
            obj["spec"]["claimRef"] = ref
            obj["metadata"].setdefault("annotations", {})[
                "pv.kubernetes.io/bound-by-controller"] = "yes"
            return obj

        self.store.update("persistentvolumes", "", pv_name, bind_pv)
        self._set_pv_phase(pv_name, "Bound")

        def bind_claim(obj: Obj) -> Obj:
            obj = copy.deepcopy(obj)
            obj["spec"]["volumeName"] = pv_name
            annotations = obj["metadata"].setdefault("annotations", {})
            annotations["pv.kubernetes.io/bind-completed"] = "yes"
            annotations["pv.kubernetes.io/bound-by-controller"] = "yes"
            return obj

        self.store.update("persistentvolumeclaims", meta["namespace"], meta["name"],
                          bind_claim)
        self.store.update("persistentvolumeclaims", meta["namespace"], meta["name"],
                          lambda obj: {**obj, "status": {
                              "phase": "Bound", "accessModes": pv["spec"].get("accessModes", []),
                              "capacity": pv["spec"].get("capacity", {})}},
                          subresource="status")

    def _find(self, claim: Obj) -> Obj | None:
        spec = claim.get("spec", {})
        meta = claim["metadata"]
        pvs, _ = self.store.list("persistentvolumes", None)
        if spec.get("volumeName"):
            named = [p for p in pvs if p["metadata"]["name"] == spec["volumeName"]]
            if named and named[0]["spec"].get("claimRef", {}).get("uid", meta["uid"]) == \
                    meta["uid"]:
                return named[0]
            return None
        want = quantity(spec.get("resources", {}).get("requests", {}).get("storage", "0"))
        modes = set(spec.get("accessModes", []))
        cls = spec.get("storageClassName") or ""
        fits = []
        for pv in pvs:
            ps = pv["spec"]
            ref = ps.get("claimRef")
            if ref and ref.get("uid") == meta["uid"]:
                return pv  # pre-bound (provisioned for it)
            if ref or pv.get("status", {}).get("phase") != "Available":
                continue
            if (ps.get("storageClassName") or "") != cls or not modes <= set(
                    ps.get("accessModes", [])):
                continue
            if (ps.get("volumeMode") or "Filesystem") != (spec.get("volumeMode")
                                                          or "Filesystem"):
                continue  # the PV controller's checkVolumeModeMismatches
            size = quantity(ps.get("capacity", {}).get("storage", "0"))
            if size >= want:
                fits.append((size, pv["metadata"]["name"], pv))
        return min(fits)[2] if fits else None

    def _provision(self, claim: Obj, cls: str) -> Obj:
        meta = claim["metadata"]
        sc = self.store.get("storageclasses", "", cls)
        spec = self.provisioners[cls](claim)
        spec = {**spec, "storageClassName": cls,
                "accessModes": claim["spec"].get("accessModes", ["ReadWriteOnce"]),
                "capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
                "persistentVolumeReclaimPolicy": sc.get("reclaimPolicy", "Delete"),
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
                             "name": meta["name"], "uid": meta["uid"], "apiVersion": "v1"}}
        return self.store.create("persistentvolumes", "", {
            "metadata": {"name": f"pvc-{meta['uid']}", "annotations": {
                "pv.kubernetes.io/provisioned-by": sc.get("provisioner", "")}},
            "spec": spec})

    # -- reclaim, ephemeral volumes, garbage collection ---------------------------------------
    def _reclaim(self, claim: Obj) -> None:
        pvs, _ = self.store.list("persistentvolumes", None)
        for pv in pvs:
            if pv["spec"].get("claimRef", {}).get("uid") != claim["metadata"]["uid"]:
                continue
            name = pv["metadata"]["name"]
            if pv["spec"].get("persistentVolumeReclaimPolicy") == "Delete":
                self.store.delete("persistentvolumes", "", name)
                self.deleted.append(name)
            else:
                self._set_pv_phase(name, "Released")

    def _ephemeral(self, pod: Obj) -> None:
        meta = pod["metadata"]
        for volume in pod.get("spec", {}).get("volumes") or []:
            template = (volume.get("ephemeral") or {}).get("volumeClaimTemplate")
            if template is None:
                continue
            tmeta = template.get("metadata") or {}
            body = {"metadata": {
                "name": f"{meta['name']}-{volume['name']}",
                **{k: tmeta[k] for k in ("labels", "annotations") if k in tmeta},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                     "uid": meta["uid"], "controller": True,
                                     "blockOwnerDeletion": True}]},
                "spec": copy.deepcopy(template["spec"])}
            try:
                self.store.create("persistentvolumeclaims", meta["namespace"], body)
            except ApiError as err:
                if err.code != 409:
                    raise

    def _collect(self, ns: str, pod_uid: str) -> None:
        claims, _ = self.store.list("persistentvolumeclaims", ns)
        for claim in claims:
            owners = claim["metadata"].get("ownerReferences") or []
            if any(o.get("uid") == pod_uid and o.get("controller") for o in owners):
                self.store.delete("persistentvolumeclaims", ns, claim["metadata"]["name"])
