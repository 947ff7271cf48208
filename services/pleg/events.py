"""Pure PLEG derivations: "old relist + new relist -> lifecycle events" (kubelet
``pkg/kubelet/pleg/generic.go`` ``generateEvents``). No I/O; tested exhaustively.

A relist is a ``Snapshot``: pod UID -> container (or sandbox) ID -> ``ContainerState``. Sandboxes
take part like containers (as in the kubelet): a ready sandbox counts as running, a not-ready one
as exited.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ContainerState",
    "EventType",
    "PodEvent",
    "Snapshot",
    "container_events",
    "generate_events",
    "state_of_container",
    "state_of_sandbox",
]


class ContainerState(enum.Enum):
    """PLEG's view of one container (kubelet ``plegContainerState``)."""

    RUNNING = "running"
    EXITED = "exited"
    UNKNOWN = "unknown"  # also CONTAINER_CREATED: the kubelet does not use "created" either
    NON_EXISTENT = "non-existent"


class EventType(enum.Enum):
    CONTAINER_STARTED = "ContainerStarted"
    CONTAINER_DIED = "ContainerDied"
    CONTAINER_REMOVED = "ContainerRemoved"
    POD_SYNC = "PodSync"
    CONTAINER_CHANGED = "ContainerChanged"


@dataclass(frozen=True)
class PodEvent:
    pod_uid: str
    type: EventType
    container_id: str


Snapshot = Mapping[str, Mapping[str, ContainerState]]

_CRI_CONTAINER_STATES = {
    "CONTAINER_RUNNING": ContainerState.RUNNING,
    "CONTAINER_EXITED": ContainerState.EXITED,
    "CONTAINER_CREATED": ContainerState.UNKNOWN,
    "CONTAINER_UNKNOWN": ContainerState.UNKNOWN,
}


def state_of_container(cri_state: str) -> ContainerState:
    """A CRI container state name (``CONTAINER_RUNNING``...) as PLEG sees it."""
    return _CRI_CONTAINER_STATES.get(cri_state, ContainerState.UNKNOWN)


def state_of_sandbox(cri_state: str) -> ContainerState:
    """A CRI sandbox state name: ready counts as running, anything else as exited."""
    return ContainerState.RUNNING if cri_state == "SANDBOX_READY" else ContainerState.EXITED


def container_events(
    pod_uid: str, container_id: str, old: ContainerState, new: ContainerState
) -> list[PodEvent]:
    """The events for one container going from ``old`` to ``new`` (the KUBELET.md table)."""
    if old == new:
        return []
    if new == ContainerState.RUNNING:
        types = [EventType.CONTAINER_STARTED]
    elif new == ContainerState.EXITED:
        types = [EventType.CONTAINER_DIED]
    elif new == ContainerState.UNKNOWN:
        types = [EventType.CONTAINER_CHANGED]
    elif old == ContainerState.EXITED:
        types = [EventType.CONTAINER_REMOVED]  # its death was reported already
    else:
        types = [EventType.CONTAINER_DIED, EventType.CONTAINER_REMOVED]
    return [PodEvent(pod_uid, t, container_id) for t in types]


def generate_events(old: Snapshot, new: Snapshot) -> list[PodEvent]:
    """Every event between two relists, ordered by pod UID then container ID (deterministic).

    A container missing from a side is NON_EXISTENT there; a pod missing from ``new`` has had
    all its containers removed.
    """
    events: list[PodEvent] = []
    for uid in sorted(old.keys() | new.keys()):
        before = old.get(uid, {})
        after = new.get(uid, {})
        for cid in sorted(before.keys() | after.keys()):
            events.extend(container_events(
                uid, cid,
                before.get(cid, ContainerState.NON_EXISTENT),
                after.get(cid, ContainerState.NON_EXISTENT),
            ))
    return events
