"""The sync loop's side of in-place resize: decisions on the loop thread, and what ``desired``
says of each pod's resize (``DesiredPod.resize``, read by status).

``Resizes.decide`` is the kubelet's ``handlePodResourcesResize`` before each sync: a pod's first
sync allocates its spec as it is; a spec whose CPU/memory differ from the allocation is decided
(``resize.decide``): accepted (the allocation checkpoint takes the spec, the changed containers'
crash back-off is reset, as the kubelet does), or pending (``PodResizePending`` with the
reason and message; the pod syncs with its allocation, and the next sync decides again). The
sync's ``ResizeReport`` (what each running container runs with) comes back through
``reported``; the pod is in progress (``PodResizeInProgress``) while a running container's
resources differ from its allocation, or an update failed (reason ``Error``).

Logged once per change of decision: ``syncloop.pod.resize.accepted``,
``syncloop.pod.resize.pending`` (reason, message); once an accepted resize is applied,
``syncloop.pod.resize.completed`` (the 1.33 kubelet's Normal ``ResizeCompleted`` event, "Pod
resize completed: " and the allocation as JSON, ``{"containers": [{"name", "resources"}]}``,
``initContainers`` first when a sidecar has one). No event for a refused resize: the 1.33
kubelet records none (its PodResizePending condition says it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from podvisor.common.logs import Log
from podvisor.ipc.maps import PodResize
from podvisor.services.pod import Container, Pod
from podvisor.services.syncloop.admission import Capacity
from podvisor.services.syncloop.allocation import AllocationStore
from podvisor.services.syncloop.backoff import SharedBackoff
from podvisor.services.syncloop.resize import (
    Amounts,
    Decision,
    Verdict,
    allocated_pod,
    changed_resources,
    decide,
    pod_amounts,
    to_quantities,
)
from podvisor.services.syncloop.resizing import ResizeReport


class Resizes:
    """Loop thread only (the store is thread-safe for the pool threads' records)."""

    def __init__(self, store: AllocationStore | None, log: Log, capacity: Capacity) -> None:
        self.store = store
        self.log = log
        self.capacity = capacity
        self._pending: dict[str, Decision] = {}
        self._reports: dict[str, ResizeReport] = {}
        self._started: dict[str, Pod] = {}  # accepted, not applied yet (for its completion)

    def allocated(self, pod: Pod) -> Pod:
        """``pod`` with its allocated resources (as it runs)."""
        if self.store is None:
            return pod
        return allocated_pod(pod, self.store.allocated(pod.uid) or {})

    def decide(self, pod: Pod, others: Iterable[Pod], backoff: SharedBackoff) -> Pod:
        """The pod this sync runs: ``pod`` itself, or with its allocated resources while a
        resize of it is pending."""
        store = self.store
        if store is None:
            return pod
        allocation = store.allocated(pod.uid)
        if allocation is None:  # first sync (or a pod adopted from before resize existed)
            store.set_allocated(pod.uid, pod_amounts(pod))
            return pod
        current = allocated_pod(pod, allocation)
        api = pod.origin is not None and pod.origin.source == "api"
        d = decide(pod, current, others, self.capacity, api)
        if d.verdict is Verdict.NONE:
            self._pending.pop(pod.uid, None)
            return pod
        if d.verdict is Verdict.ACCEPT:
            want = pod_amounts(pod)
            store.set_allocated(pod.uid, want)
            for name, a in want.items():
                if changed_resources(a, allocation.get(name, {})):
                    backoff.forget_key((pod.uid, name))
            self._pending.pop(pod.uid, None)
            self._started[pod.uid] = pod
            self.log.info("syncloop.pod.resize.accepted", pod=pod.full_name, pod_uid=pod.uid,
                          allocated={n: to_quantities(a) for n, a in want.items()})
            return pod
        if self._pending.get(pod.uid) != d:
            self.log.warning("syncloop.pod.resize.pending", pod=pod.full_name,
                             pod_uid=pod.uid, reason=str(d.verdict), message=d.message)
        self._pending[pod.uid] = d
        return current

    def reported(self, uid: str, report: ResizeReport) -> None:
        self._reports[uid] = report
        pod = self._started.get(uid)
        if pod is None or self.store is None or report.error:
            return
        allocation = self.store.allocated(uid) or {}
        if any(a != allocation.get(name, a) for name, a in report.actual.items()):
            return
        del self._started[uid]
        self.log.info("syncloop.pod.resize.completed", pod=pod.full_name, pod_uid=uid,
                      message="Pod resize completed: " + completed_summary(pod, allocation))

    def forget(self, uid: str) -> None:
        """The pod is gone: its allocation too."""
        self._pending.pop(uid, None)
        self._reports.pop(uid, None)
        self._started.pop(uid, None)
        if self.store is not None:
            self.store.forget(uid)

    def retain(self, uids: set[str]) -> None:
        """Forget the allocations of pods neither a worker nor the runtime has (gone while no
        sync loop ran: the kubelet's allocation manager removes orphaned pods the same way)."""
        if self.store is None:
            return
        for uid in sorted(self.store.uids() - uids):
            self.forget(uid)

    def state(self, pod: Pod) -> PodResize:
        """``DesiredPod.resize`` (empty without a store)."""
        if self.store is None:
            return PodResize()
        allocation = self.store.allocated(pod.uid) or {}
        report = self._reports.get(pod.uid)
        actual: Mapping[str, Amounts] = report.actual if report is not None else {}
        in_progress = any(a != allocation.get(name, a) for name, a in actual.items())
        pending = self._pending.get(pod.uid)
        error = report.error if report is not None else ""
        return PodResize(
            allocated={n: to_quantities(a) for n, a in sorted(allocation.items())},
            actual={n: to_quantities(a) for n, a in sorted(actual.items())},
            pending_reason=str(pending.verdict) if pending else "",
            pending_message=pending.message if pending else "",
            in_progress=in_progress or bool(error), error=error)


def completed_summary(pod: Pod, allocation: Mapping[str, Amounts]) -> str:
    """The ResizeCompleted event's JSON: each resizable container's allocated resources."""
    def entries(containers: Iterable[Container]) -> list[dict[str, Any]]:
        out = []
        for c in containers:
            if c.name in allocation:
                q = to_quantities(allocation[c.name])  # as Go orders it: limits, requests
                res = {part: q[part] for part in ("limits", "requests") if part in q}
                out.append({"name": c.name, "resources": res})
        return out
    doc: dict[str, Any] = {}
    if inits := entries(pod.spec.sidecars):
        doc["initContainers"] = inits
    doc["containers"] = entries(pod.spec.containers)
    return json.dumps(doc, separators=(",", ":"))
