"""Pods a source refused (an API pod with a field podvisor does not honour), as the kubelet
treats what it cannot run:

- a pod it does not run yet is rejected at admission: kept in ``desired`` with
  ``admitted: false``, reason ``UnsupportedPodSpec`` and the source's message, so its status
  says Failed / "Pod was rejected: <field>: <why>" (the API writer writes it) and an Event
  says why (``syncloop.pod.rejected``); it never starts. It goes when the source drops it, and
  is admitted afresh when the source sends a valid version.
- an update of a pod it runs is refused, never applied: PodConfig keeps the version it runs
  (``apply(keep=...)``), the pod keeps running untouched, and its status shows reason
  ``UnsupportedPodUpdate`` with the message (an Event too, ``syncloop.pod.update_refused``),
  until the source sends a version it can run again.
Only pods whose UID the source knows (API pods) are handled so; a static pod file that does not
validate stays an error of its source, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from podvisor.common.logs import Log
from podvisor.services.pod import ObjectMeta, Origin, Pod, PodSpec
from podvisor.services.syncloop.states import WorkerState
from podvisor.services.syncloop.workers import WorkerTable

UNSUPPORTED_POD_SPEC = "UnsupportedPodSpec"
UNSUPPORTED_POD_UPDATE = "UnsupportedPodUpdate"
UPDATE_REFUSED = "the update was refused and the pod runs on as it was"


@dataclass(frozen=True)
class Refusal:
    """A pod a source refused: which one, where it came from, why."""

    uid: str
    name: str
    namespace: str
    location: str
    message: str


def refusals(errors: Sequence[Mapping[str, Any]]) -> dict[str, Refusal]:
    """The refusals of a ``PodSetValue``'s errors: those that name a pod by UID."""
    out: dict[str, Refusal] = {}
    for e in errors:
        uid = e.get("uid")
        if not isinstance(uid, str) or not uid:
            continue
        location = str(e.get("url") or e.get("file") or "")
        out[uid] = Refusal(uid, str(e.get("name") or ""), str(e.get("namespace") or ""),
                           location, str(e.get("reason") or "invalid pod"))
    return out


class Refusals:
    """What the sync loop does with each source's refusals (loop thread only)."""

    def __init__(self, table: WorkerTable, log: Log) -> None:
        self._table = table
        self._log = log
        self._seen: dict[str, dict[str, Refusal]] = {}  # source -> its refusals last time

    def apply(self, source: str, refused: Mapping[str, Refusal],
              wanted: Mapping[str, Pod]) -> set[str]:
        """Take ``source``'s refusals after its set was merged (``wanted``: the pods its
        PodConfig holds, by UID); returns the UIDs whose ``desired`` entry changed."""
        changed: set[str] = set()
        for uid, r in refused.items():
            if self._one(source, r):
                changed.add(uid)
        for uid in self._seen.get(source, {}).keys() - refused.keys():
            w = self._table.get(uid)
            if w is None:
                continue
            if not w.admitted and w.reason == UNSUPPORTED_POD_SPEC and uid not in wanted:
                del self._table.workers[uid]  # gone from the source: forget the refusal
                changed.add(uid)
            elif w.admitted and w.reason == UNSUPPORTED_POD_UPDATE:
                w.reason = w.message = ""  # the source sends a version it runs again
                changed.add(uid)
        self._seen[source] = dict(refused)
        return changed

    def _one(self, source: str, r: Refusal) -> bool:
        w = self._table.get(r.uid)
        if w is not None and w.admitted:
            if w.state is not WorkerState.SYNCING or w.failed:
                return False
            message = f"{UPDATE_REFUSED}: {r.message}"
            if (w.reason, w.message) == (UNSUPPORTED_POD_UPDATE, message):
                return False
            w.reason, w.message = UNSUPPORTED_POD_UPDATE, message
            self._log.warning("syncloop.pod.update_refused",
                              pod=w.pod.full_name if w.pod else "", pod_uid=r.uid,
                              reason=UNSUPPORTED_POD_UPDATE, message=message)
            return True
        if w is not None and (w.reason, w.message) == (UNSUPPORTED_POD_SPEC, r.message):
            return False
        stub = Pod(ObjectMeta(r.name, r.namespace, r.uid), PodSpec(containers=()),
                   origin=Origin(source, r.location))
        self._table.reject(stub, source, UNSUPPORTED_POD_SPEC, r.message)
        self._log.warning("syncloop.pod.rejected", pod=stub.full_name, pod_uid=r.uid,
                          reason=UNSUPPORTED_POD_SPEC, message=r.message)
        return True
