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
from podvisor.ipc.maps import ContainerWaiting

RUNNING = "CONTAINER_RUNNING"
EXITED = "CONTAINER_EXITED"


def container_id(runtime: str, cid: str) -> str:
    return f"{runtime}://{cid}"


def terminated_state(c: Mapping[str, Any], runtime: str) -> dict[str, Any]:
    code = int(c.get("exit_code", 0))
    out: dict[str, Any] = {
        "exitCode": code,
        "reason": c.get("reason") or ("Completed" if code == 0 else "Error"),
        "startedAt": rfc3339_ns(int(c.get("started_at", 0))),
        "finishedAt": rfc3339_ns(int(c.get("finished_at", 0))),
        "containerID": container_id(runtime, str(c["id"])),
    }
    if c.get("message"):
        out["message"] = c["message"]
    return out


def runtime_state(c: Mapping[str, Any], runtime: str) -> dict[str, Any]:
    state = c.get("state")
    if state == RUNNING:
        return {"running": {"startedAt": rfc3339_ns(int(c.get("started_at", 0)))}}
    if state == EXITED:
        return {"terminated": terminated_state(c, runtime)}
    return {"waiting": {"reason": "ContainerCreating"}}


def _has_probe(spec: Mapping[str, Any], key: str) -> bool:
    return bool(spec.get(key))


def container_status(
    spec: Mapping[str, Any],
    runtime_containers: Sequence[Mapping[str, Any]],
    waiting: ContainerWaiting | None,
    default_reason: str,
    runtime: str,
    ready_override: bool | None = None,
    started_override: bool | None = None,
) -> dict[str, Any]:
    """One ``ContainerStatus`` dict. ``runtime_containers`` are this name's records in any order;
    ``ready_override`` / ``started_override`` are the prober's readiness / startup verdicts
    when it reports them."""
    history = sorted(runtime_containers, key=lambda c: (c.get("created_at", 0), c.get("id", "")),
                     reverse=True)
    out: dict[str, Any] = {"name": spec.get("name", ""), "image": spec.get("image", ""),
                           "imageID": "", "restartCount": 0, "ready": False, "started": False}
    last: dict[str, Any] = {}
    if history:
        cur = history[0]
        state = runtime_state(cur, runtime)
        out["containerID"] = container_id(runtime, str(cur["id"]))
        out["imageID"] = cur.get("image_ref", "")
        out["restartCount"] = int(cur.get("restart_count", 0))
        if len(history) > 1 and history[1].get("state") == EXITED:
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


def by_name(records: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {}
    for c in records:
        out.setdefault(str(c.get("name", "")), []).append(c)
    return out
