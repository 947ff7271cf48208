"""Container statuses from PLEG records (kubelet ``convertToAPIContainerStatuses``). Pure.

For each container of the spec, the runtime containers of that name are taken newest first: the
newest gives ``state``, the one before it ``lastState``. A waiting reason from the sync loop
(``CrashLoopBackOff``, ``CreateContainerError``, ...) replaces a non-running state, and the
container it replaces becomes ``lastState``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from podvisor.common.timefmt import rfc3339_ns
from podvisor.ipc.maps import ContainerWaiting, PlegContainer

RUNNING = "CONTAINER_RUNNING"
EXITED = "CONTAINER_EXITED"


def container_id(runtime: str, cid: str) -> str:
    return f"{runtime}://{cid}"


def terminated_state(c: PlegContainer, runtime: str) -> dict[str, Any]:
    code = c.exit_code
    out: dict[str, Any] = {
        "exitCode": code,
        "reason": c.reason or ("Completed" if code == 0 else "Error"),
        "startedAt": rfc3339_ns(c.started_at),
        "finishedAt": rfc3339_ns(c.finished_at),
        "containerID": container_id(runtime, c.id),
    }
    if c.message:
        out["message"] = c.message
    return out


def runtime_state(c: PlegContainer, runtime: str) -> dict[str, Any]:
    state = c.state
    if state == RUNNING:
        return {"running": {"startedAt": rfc3339_ns(c.started_at)}}
    if state == EXITED:
        return {"terminated": terminated_state(c, runtime)}
    return {"waiting": {"reason": "ContainerCreating"}}


def _has_probe(spec: Mapping[str, Any], key: str) -> bool:
    return bool(spec.get(key))


def container_status(
    spec: Mapping[str, Any],
    runtime_containers: Sequence[PlegContainer],
    waiting: ContainerWaiting | None,
    default_reason: str,
    runtime: str,
    ready_override: bool | None = None,
    started_override: bool | None = None,
) -> dict[str, Any]:
    """One ``ContainerStatus`` dict. ``runtime_containers`` are this name's records in any order;
    ``ready_override`` / ``started_override`` are the prober's readiness / startup verdicts
    when it reports them."""
    history = sorted(runtime_containers, key=lambda c: (c.created_at, c.id), reverse=True)
    out: dict[str, Any] = {"name": spec.get("name", ""), "image": spec.get("image", ""),
                           "imageID": "", "restartCount": 0, "ready": False, "started": False}
    last: dict[str, Any] = {}
    if history:
        cur = history[0]
        state = runtime_state(cur, runtime)
        out["containerID"] = container_id(runtime, cur.id)
        out["imageID"] = cur.image_ref
        out["restartCount"] = cur.restart_count
        if len(history) > 1 and history[1].state == EXITED:
            last = {"terminated": terminated_state(history[1], runtime)}
    else:
        state = {"waiting": {"reason": default_reason}}
    if waiting and "running" not in state:
        if "terminated" in state:
            last = state
        state = {"waiting": {k: v for k, v in (("reason", waiting.reason),
                                               ("message", waiting.message)) if v}}
    running = "running" in state
    out["state"] = state
    out["lastState"] = last
    if started_override is not None:
        out["started"] = running and started_override
    else:
        out["started"] = running and not _has_probe(spec, "startupProbe")
    if ready_override is not None:
        out["ready"] = running and ready_override
    else:
        out["ready"] = running and not _has_probe(spec, "readinessProbe")
    return out


def by_name(records: Sequence[PlegContainer]) -> dict[str, list[PlegContainer]]:
    out: dict[str, list[PlegContainer]] = {}
    for c in records:
        out.setdefault(c.name, []).append(c)
    return out
