"""Pure views served by the read-only HTTP server and printed by ``podvisorctl pods``.

- ``pod_list(desired, statuses)``: the ``GET /pods`` PodList (each pod's manifest from the
  ``desired`` map, its ``status`` from the ``statuses`` map, internal ``_`` keys removed).
- ``running_pods(pleg)``: the ``GET /runningpods/`` PodList, kubelet style (minimal metadata and
  the names and images of running containers only).
- ``check_health(...)``: the ``/healthz`` verdict (PLEG relisted within 3 min; sync loop's
  ``desired`` map owner heard from recently).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PLEG_HEALTHY_WITHIN = 180.0  # kubelet: relist threshold 3 min
SYNCLOOP_HEALTHY_WITHIN = 30.0  # the desired map owner publishes at least every second


def _public(status: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if not k.startswith("_")}


def pod_list(desired: Mapping[str, Any], statuses: Mapping[str, Any]) -> dict[str, Any]:
    items = []
    for uid, entry in desired.items():
        if uid.startswith("_") or not isinstance(entry, Mapping):
            continue
        pod = entry.get("pod")
        if not isinstance(pod, Mapping):
            continue
        out = {k: v for k, v in pod.items() if k not in ("podvisor", "status")}
        status = statuses.get(uid)
        out["status"] = _public(status) if isinstance(status, Mapping) else {"phase": "Pending"}
        items.append(out)
    items.sort(key=lambda p: (p.get("metadata", {}).get("namespace", ""),
                              p.get("metadata", {}).get("name", "")))
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}


def running_pods(pleg: Mapping[str, Any]) -> dict[str, Any]:
    items = []
    for uid, record in pleg.items():
        if uid.startswith("_") or not isinstance(record, Mapping):
            continue
        running = [c for c in record.get("containers", [])
                   if c.get("state") == "CONTAINER_RUNNING"]
        if not running:
            continue
        items.append({
            "metadata": {"name": record.get("name", ""), "namespace": record.get("namespace", ""),
                         "uid": uid, "creationTimestamp": None},
            "spec": {"containers": [{"name": c.get("name", ""), "image": c.get("image", ""),
                                     "resources": {}} for c in running]},
            "status": {},
        })
    items.sort(key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}


@dataclass(frozen=True)
class Health:
    ok: bool
    checks: tuple[tuple[str, bool, str], ...]  # (name, ok, reason)

    def text(self) -> str:
        if self.ok:
            return "ok"
        lines = [f"[{'+' if ok else '-'}]{name} {'ok' if ok else 'failed: ' + why}"
                 for name, ok, why in self.checks]
        return "\n".join([*lines, "healthz check failed"])


def check_health(pleg_health: Mapping[str, Any] | None, wall_now: float,
                 desired_synced: bool, desired_age: float | None) -> Health:
    """``desired_age``: seconds since the ``desired`` owner was last heard (None: never)."""
    checks = []
    if not pleg_health:
        checks.append(("pleg", False, "PLEG has not relisted yet"))
    else:
        age = wall_now - float(pleg_health.get("last_relist_ok", 0.0))
        ok = age < PLEG_HEALTHY_WITHIN
        checks.append(("pleg", ok, "" if ok else
                       f"PLEG last relisted {age:.0f}s ago; threshold {PLEG_HEALTHY_WITHIN:.0f}s"))
    if not desired_synced or desired_age is None:
        checks.append(("syncloop", False, "sync loop not heard from (no desired map)"))
    else:
        ok = desired_age < SYNCLOOP_HEALTHY_WITHIN
        checks.append(("syncloop", ok, "" if ok else
                       f"sync loop silent for {desired_age:.0f}s; "
                       f"threshold {SYNCLOOP_HEALTHY_WITHIN:.0f}s"))
    return Health(all(ok for _n, ok, _w in checks), tuple(checks))


def _ready_count(status: Mapping[str, Any]) -> tuple[int, int]:
    cs = status.get("containerStatuses") or []
    return sum(1 for c in cs if c.get("ready")), len(cs)


def display_status(pod: Mapping[str, Any]) -> str:
    """kubectl's STATUS column: a waiting/terminated reason of a container, else the phase."""
    status = pod.get("status") or {}
    if status.get("reason") and status.get("phase") == "Failed":
        return str(status["reason"])
    for group in ("initContainerStatuses", "containerStatuses"):
        for c in status.get(group) or []:
            state = c.get("state") or {}
            reason = (state.get("waiting") or {}).get("reason")
            if reason and reason not in ("ContainerCreating", "PodInitializing"):
                return str(reason)
    return str(status.get("phase", "Pending"))


def table_rows(podlist: Mapping[str, Any], age_of: Any) -> list[list[str]]:
    """Rows NAME, READY, STATUS, RESTARTS, AGE; ``age_of(startTime) -> str``."""
    rows = [["NAME", "READY", "STATUS", "RESTARTS", "AGE"]]
    for pod in podlist.get("items", []):
        status = pod.get("status") or {}
        ready, total = _ready_count(status)
        restarts = sum(int(c.get("restartCount", 0))
                       for c in status.get("containerStatuses") or [])
        rows.append([pod.get("metadata", {}).get("name", ""), f"{ready}/{total}",
                     display_status(pod), str(restarts), age_of(status.get("startTime"))])
    return rows
