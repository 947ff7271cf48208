"""The API's copy of a pod status against podvisor's own: whether they differ, and the patch
that writes podvisor's. Pure (the kubelet's status manager, ``pkg/kubelet/status``):

- ``differences(api, ours)`` is ``needsReconcile``'s test (``isPodStatusByKubeletEqual`` after
  ``normalizeStatus``): every condition podvisor sets that the kubelet owns or shares must be
  in the API's copy with the same status, reason and message (times and conditions of other
  owners do not count); everything else must be equal after the normalization below. Empty
  means in sync.
- ``status_patch(ours, api)`` is the body of the strategic merge patch of ``pods/status``
  (``mergePodStatus`` + ``PatchPodStatus``): the conditions merge on ``type``, so a condition
  another owner set (the scheduler's, a readiness gate's, ``DisruptionTarget``) stays, even one
  set after ``api`` was read (podvisor's status carries a gate's condition as the sync loop
  last saw it, for /pods: the patch leaves it out); a kubelet-owned condition the API has and
  podvisor does not is deleted; the container status lists are replaced whole
  (``containerStatuses`` has no merge key in kube-apiserver), ``podIPs``/``hostIPs`` too
  (``$patch: replace``); a field podvisor leaves unset is deleted (``null``), and so is a
  field of the API's copy that is neither podvisor's nor another owner's.

Normalization (both sides): times to whole seconds (the API keeps second precision), fields
that are null, ``""``, ``[]`` or ``{}`` left out (Go's ``omitempty``: the API drops them),
container statuses in name order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podvisor.common.timefmt import parse_rfc3339, rfc3339
from podvisor.ipc.podstatus import PodStatus

__all__ = ["KUBELET_CONDITIONS", "OTHERS", "WRITTEN", "differences", "status_patch",
           "terminal_in_api"]

# kubetypes.PodConditionsByKubelet (+ PodReadyToStartContainers, on by default since 1.29)
KUBELET_CONDITIONS = frozenset({"PodScheduled", "Ready", "Initialized", "ContainersReady",
                                "PodReadyToStartContainers", "PodResizePending",
                                "PodResizeInProgress"})
SHARED_CONDITIONS = frozenset({"DisruptionTarget"})  # kubetypes.PodConditionSharedByKubelet
# status fields other owners write (the scheduler, the resource claim controller): never
# compared, never deleted
OTHERS = frozenset({"nominatedNodeName", "resourceClaimStatuses",
                    "extendedResourceClaimStatus"})
# set by the API server when the pod is created (and immutable since): compared and written
# only when podvisor has one
API_SET = frozenset({"qosClass"})
# every field ``PodStatus.to_dict`` may hold but the conditions: podvisor's to write or delete
WRITTEN = ("hostIP", "hostIPs", "startTime", "qosClass", "phase", "reason", "message", "podIP",
           "podIPs", "containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses")
REPLACED = ("podIPs", "hostIPs")  # lists with a merge key in the API, replaced whole
TIMES = frozenset({"startTime", "startedAt", "finishedAt", "lastTransitionTime",
                   "lastProbeTime"})
SORTED = ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses")
TERMINAL = ("Succeeded", "Failed")


def _second(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return rfc3339(parse_rfc3339(value))
    except ValueError:
        return value


def _normal_map(value: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` with empty fields left out and times in seconds (see the module)."""
    out = {}
    for k, v in value.items():
        v = _normal(v, str(k))
        if v not in (None, "", [], {}):
            out[str(k)] = v
    return out


def _normal(value: Any, key: str = "") -> Any:
    if isinstance(value, Mapping):
        return _normal_map(value)
    if isinstance(value, list | tuple):
        items = [_normal(v) for v in value]
        if key in SORTED:
            items.sort(key=lambda c: str(c.get("name", "")) if isinstance(c, dict) else "")
        return items
    return _second(value) if key in TIMES else value


def _conditions(status: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    raw = status.get("conditions")
    return {str(c.get("type", "")): c for c in raw if isinstance(c, Mapping)} \
        if isinstance(raw, list) else {}


def _compared(status: Mapping[str, Any], ours: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``status`` that count, normalized (conditions apart)."""
    skip = OTHERS | {"conditions"} | {k for k in API_SET if k not in ours}
    return _normal_map({k: v for k, v in status.items() if k not in skip})


def differences(api: Mapping[str, Any], ours: PodStatus) -> list[str]:
    """What of the API's copy ``api`` (a pod's ``status`` as the API holds it) differs from
    ``ours`` by the kubelet's rule: ``conditions.<type>`` for a condition, else the field's
    name; empty when in sync."""
    mine = ours.to_dict()
    theirs = _conditions(api)
    out = []
    for cond in ours.conditions:
        if cond.type not in KUBELET_CONDITIONS | SHARED_CONDITIONS:
            continue
        other = theirs.get(cond.type)
        if other is None or (str(other.get("status", "")), str(other.get("reason") or ""),
                             str(other.get("message") or "")) != \
                (cond.status, cond.reason, cond.message):
            out.append(f"conditions.{cond.type}")
    a, b = _compared(api, mine), _compared(mine, mine)
    out.extend(sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k)))
    return out


def terminal_in_api(api: Mapping[str, Any], ours: PodStatus) -> bool:
    """The API's copy is in a terminal phase and ``ours`` is not: the API server refuses to
    take a pod out of a terminal phase, so no patch can reconcile it."""
    return api.get("phase") in TERMINAL and ours.phase not in TERMINAL


def status_patch(ours: PodStatus, api: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``status`` of the strategic merge patch that writes ``ours`` over ``api`` (the
    API's copy; None when status-api has none yet: then only podvisor's own fields are
    written or deleted)."""
    mine = ours.to_dict()
    body: dict[str, Any] = {}
    for key in WRITTEN:
        value = mine.get(key)
        if key in API_SET and value is None:
            continue
        if key in REPLACED:
            body[key] = [*value, {"$patch": "replace"}] if value else None
        else:
            body[key] = value
    # only the conditions the kubelet owns or shares (mergePodStatus): those of other owners
    # that ``ours`` carries (copied from the pod as the sync loop last saw it: a readiness
    # gate's) may be older than the API's, and the merge keeps the API's
    conditions: list[dict[str, Any]] = [c.to_dict() for c in ours.conditions
                                        if c.type in KUBELET_CONDITIONS | SHARED_CONDITIONS]
    if api is not None:
        for key in api:
            if key not in body and key not in OTHERS and key not in API_SET and \
                    key != "conditions":
                body[key] = None
        mine_types = {c.type for c in ours.conditions}
        conditions += [{"type": t, "$patch": "delete"} for t in _conditions(api)
                       if t in KUBELET_CONDITIONS and t not in mine_types]
    body["conditions"] = conditions
    return body
