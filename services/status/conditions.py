"""Pod conditions, as the kubelet's ``status/generate.go`` and status manager make them. Pure.

- The kubelet owns ``PodScheduled``, ``PodReadyToStartContainers``, ``Initialized``,
  ``ContainersReady`` and ``Ready``; every other condition (set by a controller through the
  API, e.g. a readiness gate's) is kept as the API pod has it, first, as the status manager's
  ``mergePodStatus`` keeps them.
- ``Initialized``: every init container done (a regular one exited 0, a sidecar started);
  ``ContainersReady``: every sidecar and regular container ready (``[names]`` of those that are
  not); ``Ready``: ContainersReady, and every ``readinessGates`` condition present and True
  (else ``ReadinessGatesNotReady``, the kubelet's message per gate). A Succeeded pod is
  ``PodCompleted``, a Failed one ``PodFailed``. An evicted pod (failed with reason
  ``Evicted``) gets ``DisruptionTarget`` True, reason ``TerminationByKubelet``, the eviction's
  message.
- ``lastTransitionTime``: the previous one's while a kubelet condition keeps its status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from podvisor.common.timefmt import rfc3339
from podvisor.ipc.maps import PodResize
from podvisor.ipc.podstatus import ContainerStatus, PodCondition, PodStatus

KUBELET_CONDITIONS = frozenset({"PodScheduled", "PodReadyToStartContainers", "Initialized",
                                "ContainersReady", "Ready", "PodResizePending",
                                "PodResizeInProgress"})
RESIZE_PENDING, RESIZE_IN_PROGRESS = "PodResizePending", "PodResizeInProgress"
SUCCEEDED, FAILED = "Succeeded", "Failed"
# an evicted pod (a FailPod with reason Evicted): the condition the kubelet adds (it shares the
# type with the controllers that set it through the API)
EVICTED, DISRUPTION_TARGET, TERMINATION_BY_KUBELET = ("Evicted", "DisruptionTarget",
                                                       "TerminationByKubelet")


def external_conditions(status: Mapping[str, Any]) -> list[PodCondition]:
    """The conditions of the API pod's ``status`` that the kubelet does not own (a pod's
    ``status`` as its source kept it); malformed entries are skipped."""
    out: list[PodCondition] = []
    for raw in status.get("conditions") or ():
        if not isinstance(raw, Mapping) or not isinstance(raw.get("type"), str) \
                or raw["type"] in KUBELET_CONDITIONS:
            continue
        out.append(PodCondition(raw["type"], str(raw.get("status") or "Unknown"),
                                str(raw.get("reason") or ""), str(raw.get("message") or ""),
                                raw.get("lastTransitionTime") if isinstance(
                                    raw.get("lastTransitionTime"), str) else None))
    return out


def condition(ctype: str, ok: bool, reason: str = "", message: str = "") -> PodCondition:
    return PodCondition(ctype, "True" if ok else "False", reason, message)


def _names(names: Iterable[str]) -> str:
    return f"[{' '.join(names)}]"


def _gates(gates: Sequence[str], external: Sequence[PodCondition]) -> list[str]:
    found = {c.type: c for c in external}
    out = []
    for gate in gates:
        c = found.get(gate)
        if c is None:
            out.append(f'corresponding condition of pod readiness gate "{gate}" does not exist.')
        elif not c.true:
            out.append(f'the status of pod readiness gate "{gate}" is not "True", but '
                       f"{c.status}")
    return out


def kubelet_conditions(phase: str, sandbox_ready: bool, init_pending: Sequence[str],
                       ready_set: Sequence[ContainerStatus], gates: Sequence[str] = (),
                       external: Sequence[PodCondition] = ()) -> list[PodCondition]:
    """The kubelet's own conditions. ``ready_set``: the statuses ContainersReady is about
    (sidecars, then regular containers)."""
    conds = [condition("PodReadyToStartContainers", sandbox_ready)]
    if init_pending:
        conds.append(condition("Initialized", False, "ContainersNotInitialized",
                               f"containers with incomplete status: {_names(init_pending)}"))
    else:
        conds.append(condition("Initialized", True))
    unready = [cs.name for cs in ready_set if not cs.ready]
    if phase in (SUCCEEDED, FAILED):
        why = "PodCompleted" if phase == SUCCEEDED else "PodFailed"
        ready = [condition("ContainersReady", False, why), condition("Ready", False, why)]
    elif unready:
        msg = f"containers with unready status: {_names(unready)}"
        ready = [condition("ContainersReady", False, "ContainersNotReady", msg),
                 condition("Ready", False, "ContainersNotReady", msg)]
    elif blocked := _gates(gates, external):
        ready = [condition("ContainersReady", True),
                 condition("Ready", False, "ReadinessGatesNotReady", ", ".join(blocked))]
    else:
        ready = [condition("ContainersReady", True), condition("Ready", True)]
    return [*conds, *ready, condition("PodScheduled", True)]


def resize_conditions(resize: PodResize) -> list[PodCondition]:
    """The kubelet's in-place resize conditions (1.33) from ``DesiredPod.resize``:
    ``PodResizePending`` (reason Infeasible or Deferred, the kubelet's message) while a resize
    is refused, ``PodResizeInProgress`` (reason Error and the message when an update failed)
    while an accepted one is not applied yet; neither otherwise."""
    out = []
    if resize.pending_reason:
        out.append(condition(RESIZE_PENDING, True, resize.pending_reason,
                             resize.pending_message))
    if resize.in_progress:
        out.append(condition(RESIZE_IN_PROGRESS, True, "Error" if resize.error else "",
                             resize.error))
    return out


def stamp(conds: list[PodCondition], previous: PodStatus | None,
          now: float) -> tuple[PodCondition, ...]:
    """Each kubelet condition with its ``lastTransitionTime``: the previous one's while its
    status is unchanged, else ``now``. (External conditions carry their own.)"""
    prev = {c.type: c for c in previous.conditions} if previous is not None else {}
    out = []
    for cond in conds:
        old = prev.get(cond.type)
        if old is not None and old.status == cond.status and old.last_transition_time:
            at = old.last_transition_time
        else:
            at = rfc3339(now)
        out.append(PodCondition(cond.type, cond.status, cond.reason, cond.message, at))
    return tuple(out)
