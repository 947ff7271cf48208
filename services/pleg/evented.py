"""Evented PLEG: one GetContainerEvents event -> the pod's new record, without asking the runtime
(kubelet ``pkg/kubelet/pleg/evented.go``, which builds the pod status from the event's
``pod_sandbox_status`` and ``containers_statuses``). Pure; ``relist.py`` keeps the state.

An event carries a consistent snapshot of one sandbox and every container of it (the event's
own container first; absent after CONTAINER_DELETED_EVENT). The pod's other sandboxes, and the
containers of this sandbox the event does not list, keep what the last relist or event said: a
container leaves only by its own CONTAINER_DELETED_EVENT (a missed one means dropped events,
which make the caller relist) or a relist.

Stale events: an event taken before a relist's listing may be applied after it (it was still
in flight when the relist drained the queue). It must not move anything back, so an object
keeps its record when the event shows it in an earlier state (CRI states only go forward:
created -> running -> exited for containers, ready -> not ready for sandboxes), and objects a
relist or an event saw removed (``dead``: IDs are never reused) are not brought back. An object
the caller does not know at all, in an event taken before the last relist started
(``listed_at``, wall-clock ns like the event's ``created_at``, as the kubelet compares them), was
gone by that relist's listing: it is not created either (a wall clock stepped back can delay a
new object until its next event or the next relist, never lose it for longer).
"""

from __future__ import annotations

from collections.abc import Container as Contains
from dataclasses import dataclass, field
from typing import Any

from cri_api.v1 import api_pb2 as pb

from podvisor.services.pleg.events import ContainerState, state_of_container, state_of_sandbox
from podvisor.services.pleg.records import (
    NAME_LABEL,
    NAMESPACE_LABEL,
    UID_LABEL,
    Inspected,
    container_record_of_status,
    sandbox_record,
)

__all__ = ["EventUpdate", "apply_event", "event_pod_uid", "states_of"]

# the order in which CRI states follow each other; an unknown container may be anything alive
_CONTAINER_RANK = {"CONTAINER_CREATED": 0, "CONTAINER_UNKNOWN": 1, "CONTAINER_RUNNING": 1,
                   "CONTAINER_EXITED": 2}
_SANDBOX_RANK = {"SANDBOX_READY": 0, "SANDBOX_NOTREADY": 1}


@dataclass
class EventUpdate:
    record: dict[str, Any] | None  # the pod's record after the event; None: nothing is left
    removed: list[str] = field(default_factory=list)  # object IDs the event removed
    fresh: Inspected = field(default_factory=dict)  # objects taken from the event, by ID


def event_pod_uid(event: pb.ContainerEventResponse) -> str:
    """The pod UID the event names (sandbox label, sandbox metadata, a container's label);
    "" when it names none (the caller then looks the object up)."""
    if event.HasField("pod_sandbox_status"):
        sb = event.pod_sandbox_status
        uid = sb.labels.get(UID_LABEL) or sb.metadata.uid
        if uid:
            return str(uid)
    for st in event.containers_statuses:
        if uid := st.labels.get(UID_LABEL):
            return str(uid)
    return ""


def states_of(record: dict[str, Any] | None) -> dict[str, ContainerState]:
    """A record's PLEG states by object ID (the relist snapshot's shape)."""
    if record is None:
        return {}
    out = {s["id"]: state_of_sandbox(s["state"]) for s in record["sandboxes"]}
    out.update({c["id"]: state_of_container(c["state"]) for c in record["containers"]})
    return out


def _not_older(held: dict[str, Any] | None, new: dict[str, Any], rank: dict[str, int]) -> bool:
    return held is None or rank.get(new["state"], 0) >= rank.get(held["state"], 0)


def _names(event: pb.ContainerEventResponse, old: dict[str, Any] | None) -> tuple[str, str]:
    name = str(old["name"]) if old else ""
    namespace = str(old["namespace"]) if old else ""
    if event.HasField("pod_sandbox_status"):
        sb = event.pod_sandbox_status
        name = name or sb.labels.get(NAME_LABEL) or sb.metadata.name
        namespace = namespace or sb.labels.get(NAMESPACE_LABEL) or sb.metadata.namespace
    for st in event.containers_statuses:
        name = name or st.labels.get(NAME_LABEL, "")
        namespace = namespace or st.labels.get(NAMESPACE_LABEL, "")
    return name, namespace


def apply_event(
    event: pb.ContainerEventResponse, old: dict[str, Any] | None, ts: float,
    dead: Contains[str] = frozenset(), listed_at: int = 0,
) -> EventUpdate:
    """The pod's record after ``event`` (``old``: its record before, None when unknown).
    ``ts`` becomes the record's ``ts``; ``dead``: IDs known to be removed; ``listed_at``: when
    the last relist started (wall ns; 0: none)."""
    sandboxes = {s["id"]: s for s in old["sandboxes"]} if old else {}
    containers = {c["id"]: c for c in old["containers"]} if old else {}
    out = EventUpdate(None)
    subject = event.container_id
    deleted = event.container_event_type == pb.CONTAINER_DELETED_EVENT
    has_sandbox = event.HasField("pod_sandbox_status") and bool(event.pod_sandbox_status.id)
    sandbox_id = event.pod_sandbox_status.id if has_sandbox else ""
    if not sandbox_id and subject in containers:
        sandbox_id = containers[subject]["sandbox_id"]
    sandbox_gone = deleted and (subject == sandbox_id or subject in sandboxes)
    stale = 0 < event.created_at < listed_at  # unknown objects in it are gone already
    if deleted:  # the subject (container, or sandbox with its containers) is gone
        out.removed.append(subject)
        containers.pop(subject, None)
        if sandbox_gone:
            sandboxes.pop(subject, None)
            for cid in [cid for cid, c in containers.items() if c["sandbox_id"] == subject]:
                del containers[cid]
                out.removed.append(cid)
    if has_sandbox and not sandbox_gone and sandbox_id not in dead:
        sb = event.pod_sandbox_status
        rec = sandbox_record(sb, sb)  # the status stands for the listing
        held = sandboxes.get(sb.id)
        if (held is not None or not stale) and _not_older(held, rec, _SANDBOX_RANK):
            sandboxes[sb.id] = rec
            out.fresh[sb.id] = (rec["state"], rec)
    for st in [] if sandbox_gone else event.containers_statuses:
        if st.id in dead or (deleted and st.id == subject):
            continue
        held = containers.get(st.id)
        if held is None and stale:
            continue
        rec = container_record_of_status(st, sandbox_id)
        if _not_older(held, rec, _CONTAINER_RANK):
            containers[st.id] = rec
            out.fresh[st.id] = (rec["state"], rec)
    if not sandboxes and not containers:
        return out
    name, namespace = _names(event, old)
    out.record = {
        "ts": ts, "name": name, "namespace": namespace,
        "sandboxes": sorted(sandboxes.values(), key=lambda s: (s["created_at"], s["id"])),
        "containers": sorted(containers.values(), key=lambda c: (c["created_at"], c["id"])),
    }
    return out
