"""Pure views served by the read-only HTTP server and printed by ``podvisorctl pods``.

- ``pod_list(desired, statuses)``: the ``GET /pods`` PodList (each pod's manifest from the
  ``desired`` map, its ``status`` the PodStatus of the ``statuses`` map's value).
- ``running_pods(pleg)``: the ``GET /runningpods/`` PodList, kubelet style (minimal metadata and
  the names and images of running containers only).
- ``check_health(...)``: the ``/healthz`` verdict (PLEG relisted within 3 min; sync loop's
  ``desired`` map owner heard from recently). The runtime's network readiness (the sync loop's
  ``_runtime`` entry of ``desired``) is a detail, not a verdict: as the kubelet's, whose
  ``/healthz`` stays ok while its node condition says the network is not ready, the answer is
  still 200, but it lists every check and ``[!]runtime-network`` with the runtime's reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podvisor.ipc.maps import (
    DesiredPod,
    DesiredValue,
    PlegHealth,
    PlegPod,
    PlegValue,
    PodRef,
    PodStatusValue,
    RuntimeNetwork,
)
from podvisor.ipc.podstatus import PodStatus
from podvisor.ipc.wire import MapValueError

PLEG_HEALTHY_WITHIN = 180.0  # kubelet: relist threshold 3 min
SYNCLOOP_HEALTHY_WITHIN = 30.0  # the desired map owner publishes at least every second


def _public(status: PodStatusValue | None) -> dict[str, Any]:
    """A ``statuses`` value's PodStatus as the API's JSON (Pending while there is none)."""
    return status.status.to_dict() if status is not None else {"phase": "Pending"}


def _manifest(entry: DesiredPod) -> dict[str, Any]:
    """The pod as the API object, without podvisor's own key and the (stale) source status:
    the item's head, written as the source sent it."""
    return {k: v for k, v in entry.pod.items() if k not in ("podvisor", "status")}


def _sort_key(ref: PodRef) -> tuple[str, str]:
    return (ref.namespace, ref.name)


def pod_list(desired: Mapping[str, DesiredValue],
             statuses: Mapping[str, PodStatusValue]) -> dict[str, Any]:
    pods = [(_sort_key(entry.ref), uid, entry) for uid, entry in desired.items()
            if isinstance(entry, DesiredPod)]
    pods.sort(key=lambda p: p[0])
    items = [{**_manifest(entry), "status": _public(statuses.get(uid))}
             for _key, uid, entry in pods]
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}


class _Pod:
    """One pod's rendered JSON (UTF-8): the manifest part (kept while the ``pod`` dict is equal:
    the sync loop's own keys of a ``desired`` entry change without touching it) and the status
    part (kept while the status object is the same)."""

    __slots__ = ("entry", "head", "pod", "sort_key", "status", "text")

    def __init__(self, entry: DesiredPod, pod: Mapping[str, Any]) -> None:
        self.entry = entry
        self.pod = pod
        manifest = _manifest(entry)
        body = json.dumps(manifest, separators=(",", ":"))
        self.head = body[:-1] + (',"status":' if manifest else '"status":')
        self.sort_key = _sort_key(entry.ref)
        self.status: Any = _UNSET
        self.text = b""

    def render(self, status: PodStatusValue | None) -> None:
        public = _public(status)
        self.text = (self.head + json.dumps(public, separators=(",", ":")) + "}").encode()
        self.status = status


_UNSET = object()


class PodListJson:
    """``json.dumps(pod_list(desired, statuses), separators=(",", ":")).encode()``, built from
    each pod's JSON, kept per ``desired`` entry (re-rendered when its ``pod`` dict changes) and
    ``statuses`` value (replicas replace a value when it changes and never mutate it, so the
    same object, held here so its id cannot be reused, renders the same text); the order is
    sorted again only when a pod comes, goes or changes name. The whole body is kept for the
    last pair of maps (a ``View`` publishes new mappings when they move). A client polling
    /pods every few ms while 200 pods start costs a pass over the pods and one join per
    request, not a JSON document."""

    _HEAD = b'{"kind":"PodList","apiVersion":"v1","metadata":{},"items":['

    def __init__(self) -> None:
        self._pods: dict[str, _Pod] = {}
        self._uids: list[str] = []  # sorted by namespace and name
        self._last: tuple[Any, Any, bytes] | None = None

    def render(self, desired: Mapping[str, DesiredValue],
               statuses: Mapping[str, PodStatusValue]) -> bytes:
        last = self._last
        if last is not None and last[0] is desired and last[1] is statuses:
            return last[2]
        pods, moved = self._pods, False
        fresh: dict[str, _Pod] = {}
        status_of = statuses.get
        for uid, entry in desired.items():
            hit = pods.get(uid)
            if hit is None or hit.entry is not entry:
                if not isinstance(entry, DesiredPod):
                    continue
                pod = entry.pod
                if hit is None or hit.pod != pod:
                    new = _Pod(entry, pod)
                    moved = moved or hit is None or new.sort_key != hit.sort_key
                    hit = new
                hit.entry = entry
            status = status_of(uid)
            if status is not hit.status:
                hit.render(status)
            fresh[uid] = hit
        if moved or len(fresh) != len(pods):
            self._uids = sorted(fresh, key=lambda uid: fresh[uid].sort_key)
        self._pods = fresh
        body = self._HEAD + b",".join([fresh[uid].text for uid in self._uids]) + b"]}"
        self._last = (desired, statuses, body)
        return body


def running_pods(pleg: Mapping[str, PlegValue]) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for uid, record in pleg.items():
        if not isinstance(record, PlegPod):
            continue
        running = [c for c in record.containers if c.state == "CONTAINER_RUNNING"]
        if not running:
            continue
        items.append({
            "metadata": {"name": record.name, "namespace": record.namespace,
                         "uid": uid, "creationTimestamp": None},
            "spec": {"containers": [{"name": c.name, "image": c.image,
                                     "resources": {}} for c in running]},
            "status": {},
        })
    items.sort(key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}


@dataclass(frozen=True)
class Health:
    ok: bool
    checks: tuple[tuple[str, bool, str], ...]  # (name, ok, reason)
    notes: tuple[tuple[str, str], ...] = ()  # (name, detail): not failures, shown all the same

    def text(self) -> str:
        if self.ok and not self.notes:
            return "ok"
        lines = [f"[{'+' if ok else '-'}]{name} {'ok' if ok else 'failed: ' + why}"
                 for name, ok, why in self.checks]
        lines += [f"[!]{name} {detail}" for name, detail in self.notes]
        return "\n".join([*lines, "healthz check passed" if self.ok else "healthz check failed"])


def _runtime_notes(runtime: object) -> tuple[tuple[str, str], ...]:
    if isinstance(runtime, RuntimeNetwork) and runtime.host_network:
        return (("runtime-network", f"host network mode: {runtime.message}"),)
    if not isinstance(runtime, RuntimeNetwork) or runtime.ready:
        return ()
    return (("runtime-network", f"{runtime.condition or 'network not ready'} (pods "
                                "without hostNetwork wait for it)"),)


def check_health(pleg_health: PlegValue | None, wall_now: float,
                 desired_synced: bool, desired_age: float | None,
                 runtime: DesiredValue | None = None) -> Health:
    """``desired_age``: seconds since the ``desired`` owner was last heard (None: never);
    ``runtime``: the ``desired`` map's ``_runtime`` entry (the runtime's network readiness)."""
    checks = []
    if not isinstance(pleg_health, PlegHealth):
        checks.append(("pleg", False, "PLEG has not relisted yet"))
    else:
        age = wall_now - pleg_health.last_relist_ok
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
    return Health(all(ok for _n, ok, _w in checks), tuple(checks), _runtime_notes(runtime))


def display_status(status: PodStatus) -> str:
    """kubectl's STATUS column: a waiting/terminated reason of a container, else the phase."""
    if status.reason and status.phase == "Failed":
        return status.reason
    for c in (*status.init_container_statuses, *status.container_statuses):
        waiting = c.state.waiting
        if waiting is not None and waiting.reason and waiting.reason not in (
                "ContainerCreating", "PodInitializing"):
            return waiting.reason
    return status.phase


def _item(pod: Any) -> tuple[str, PodStatus]:
    """A PodList item's name and typed status (a malformed status reads as Pending)."""
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    name = str(meta.get("name", "")) if isinstance(meta, Mapping) else ""
    try:
        status = PodStatus.from_dict(pod.get("status") or {})
    except (MapValueError, AttributeError):
        status = PodStatus()
    return name, status


def table_rows(podlist: Mapping[str, Any], age_of: Any, wide: bool = False) -> list[list[str]]:
    """Rows NAME, READY, STATUS, RESTARTS, AGE (``wide``: and IP, as ``kubectl get pods -o
    wide``; ``<none>`` while the pod has none) of a PodList (``GET /pods``'s JSON);
    ``age_of(startTime) -> str``."""
    rows = [["NAME", "READY", "STATUS", "RESTARTS", "AGE", *(["IP"] if wide else [])]]
    for pod in podlist.get("items", []):
        name, status = _item(pod)
        regular = status.container_statuses
        ready = sum(1 for c in regular if c.ready)
        restarts = sum(c.restart_count for c in regular)
        rows.append([name, f"{ready}/{len(regular)}", display_status(status), str(restarts),
                     age_of(status.start_time), *([status.pod_ip or "<none>"] if wide else [])])
    return rows
