"""From CRI listings to PLEG records: group by pod UID, inspect, and render the ``pleg`` map value.

A pod's record (PLEG's own form of it, as its relist cache and events keep it):
``{"ts", "name", "namespace", "sandboxes": [...], "containers": [...]}``; ``pleg_value`` turns it
into the ``pleg`` map's declared value (``podvisor.ipc.maps.PlegPod``). Only sandboxes and
containers that carry the ``io.kubernetes.pod.uid`` label (containers may instead inherit it from
their sandbox) are podvisor's; everything else in the runtime is ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cri_api.v1 import api_pb2 as pb

from podvisor.common import labels
from podvisor.ipc.maps import PlegContainer, PlegPod, PlegSandbox
from podvisor.services.cri import CriError, RuntimeClient
from podvisor.services.pleg.events import Snapshot, state_of_container, state_of_sandbox
from podvisor.services.pleg.termination import termination_message

UID_LABEL = labels.POD_UID
NAME_LABEL = labels.POD_NAME
NAMESPACE_LABEL = labels.POD_NAMESPACE
HASH_ANNOTATION = labels.CONTAINER_HASH
RESTART_ANNOTATION = labels.RESTART_COUNT


@dataclass
class ListedPod:
    """One pod as seen by ListPodSandbox + ListContainers."""

    uid: str
    name: str = ""
    namespace: str = ""
    sandboxes: list[pb.PodSandbox] = field(default_factory=list)
    containers: list[pb.Container] = field(default_factory=list)


_SANDBOX_STATES = {int(v): str(k) for k, v in pb.PodSandboxState.items()}
_CONTAINER_STATES = {int(v): str(k) for k, v in pb.ContainerState.items()}


def sandbox_state(s: pb.PodSandbox | pb.PodSandboxStatus) -> str:
    # a dict lookup: EnumTypeWrapper.Name is a Python call per object (Name raises on others)
    return _SANDBOX_STATES.get(s.state) or str(pb.PodSandboxState.Name(s.state))


def container_state(c: pb.Container | pb.ContainerStatus) -> str:
    return _CONTAINER_STATES.get(c.state) or str(pb.ContainerState.Name(c.state))


def group_by_pod(
    sandboxes: Iterable[pb.PodSandbox], containers: Iterable[pb.Container]
) -> dict[str, ListedPod]:
    """Group a listing by pod UID (label first, sandbox metadata as fallback)."""
    pods: dict[str, ListedPod] = {}
    sandbox_uid: dict[str, str] = {}
    for s in sandboxes:
        uid = s.labels.get(UID_LABEL) or s.metadata.uid
        if not uid:
            continue
        sandbox_uid[s.id] = uid
        pod = pods.setdefault(uid, ListedPod(uid))
        pod.name = pod.name or s.labels.get(NAME_LABEL) or s.metadata.name
        pod.namespace = pod.namespace or s.labels.get(NAMESPACE_LABEL) or s.metadata.namespace
        pod.sandboxes.append(s)
    for c in containers:
        uid = c.labels.get(UID_LABEL) or sandbox_uid.get(c.pod_sandbox_id, "")
        if not uid:
            continue
        pod = pods.setdefault(uid, ListedPod(uid))
        pod.name = pod.name or c.labels.get(NAME_LABEL, "")
        pod.namespace = pod.namespace or c.labels.get(NAMESPACE_LABEL, "")
        pod.containers.append(c)
    return pods


def snapshot_of(pods: dict[str, ListedPod]) -> Snapshot:
    """The PLEG state of every container and sandbox, for ``generate_events``."""
    out: dict[str, dict[str, Any]] = {}
    for uid, pod in pods.items():
        states = {s.id: state_of_sandbox(sandbox_state(s)) for s in pod.sandboxes}
        states.update({c.id: state_of_container(container_state(c)) for c in pod.containers})
        out[uid] = states
    return out


def _restart_count(annotations: Any, attempt: int) -> int:
    try:
        return int(annotations.get(RESTART_ANNOTATION, attempt))
    except (TypeError, ValueError):
        return attempt


def sandbox_record(s: pb.PodSandbox | pb.PodSandboxStatus,
                   status: pb.PodSandboxStatus | None) -> dict[str, Any]:
    """The contract's sandbox dict: the listing ``s`` (or a status standing for it, as in an
    event) and its status (None: inspection failed)."""
    src = status if status is not None else s
    return {
        "id": s.id,
        "state": sandbox_state(src),
        "created_at": int(s.created_at),
        "attempt": int(s.metadata.attempt),
        "ip": status.network.ip if status is not None else "",
        "additional_ips": ([a.ip for a in status.network.additional_ips if a.ip]
                           if status is not None else []),
    }


def container_record(c: pb.Container, status: pb.ContainerStatus | None) -> dict[str, Any]:
    """The contract's container dict; without ``status`` (inspection failed) from the listing."""
    st = status if status is not None else pb.ContainerStatus()
    annotations = c.annotations if status is None else status.annotations or c.annotations
    image = (st.image.image if status is not None else "") or c.image.image
    return _container(c.id, c.metadata, c.pod_sandbox_id, status if status is not None else c,
                      c.created_at, st, image, st.image_ref or c.image_ref, annotations)


def container_record_of_status(st: pb.ContainerStatus, sandbox_id: str) -> dict[str, Any]:
    """``container_record`` of a container listed exactly as its status says (an event's
    ``containers_statuses``): the same dict, without building the listing's message."""
    return _container(st.id, st.metadata, sandbox_id, st, st.created_at, st, st.image.image,
                      st.image_ref, st.annotations)


def _container(cid: str, meta: pb.ContainerMetadata, sandbox_id: str,
               state_of: pb.Container | pb.ContainerStatus, created_at: int,
               st: pb.ContainerStatus, image: str, image_ref: str, annotations: Any,
               ) -> dict[str, Any]:
    attempt = int(meta.attempt)
    return {
        "id": cid,
        "name": meta.name,
        "sandbox_id": sandbox_id,
        "attempt": attempt,
        "state": container_state(state_of),
        "created_at": int(created_at),
        "started_at": int(st.started_at),
        "finished_at": int(st.finished_at),
        "exit_code": int(st.exit_code),
        "reason": st.reason,
        "message": termination_message(st, annotations),
        "image": image,
        "image_ref": image_ref,
        "hash": annotations.get(HASH_ANNOTATION, ""),
        "restart_count": _restart_count(annotations, attempt),
        "log_path": st.log_path,
    }


Beat = Callable[[], object]


Inspected = dict[str, tuple[str, dict[str, Any]]]  # object id -> (listed state, record)


def inspect_pod(
    client: RuntimeClient, pod: ListedPod, ts: float, beat: Beat = lambda: None,
    known: Inspected | None = None,
) -> tuple[dict[str, Any], bool]:
    """Inspect every sandbox and container of ``pod``; returns ``(record, complete)``.

    ``complete`` is False when some inspection failed (other than NOT_FOUND, which means it was
    removed meanwhile): the record then carries the listing's data and the pod is re-inspected
    on the next relist (kubelet ``needsReinspection``). ``beat`` runs between CRI calls so a slow
    runtime cannot starve the heartbeat. ``known``: records of earlier complete inspections by
    object ID, reused while the listing shows the same state (what a status call returns
    changes only with the state: start/finish times, exit code, reason, IP) and updated here.
    """
    complete = True
    cache: Inspected = {} if known is None else known
    sandboxes: list[dict[str, Any]] = []
    for s in sorted(pod.sandboxes, key=lambda s: (s.created_at, s.id)):
        state = sandbox_state(s)
        if (hit := cache.get(s.id)) is not None and hit[0] == state:
            sandboxes.append(hit[1])
            continue
        beat()
        try:
            sandboxes.append(sandbox_record(s, client.pod_sandbox_status(s.id)))
            cache[s.id] = (state, sandboxes[-1])
        except CriError as err:
            if err.not_found:
                continue
            complete = False
            sandboxes.append(sandbox_record(s, None))
    containers: list[dict[str, Any]] = []
    for c in sorted(pod.containers, key=lambda c: (c.created_at, c.id)):
        state = container_state(c)
        if (hit := cache.get(c.id)) is not None and hit[0] == state:
            containers.append(hit[1])
            continue
        beat()
        try:
            containers.append(container_record(c, client.container_status(c.id)))
            cache[c.id] = (state, containers[-1])
        except CriError as err:
            if err.not_found:
                continue
            complete = False
            containers.append(container_record(c, None))
    record = {"ts": ts, "name": pod.name, "namespace": pod.namespace,
              "sandboxes": sandboxes, "containers": containers}
    return record, complete


def pleg_value(record: Mapping[str, Any]) -> PlegPod:
    """The ``pleg`` map's typed value of a record built here (what the map carries)."""
    return PlegPod(
        ts=float(record["ts"]), name=str(record["name"]), namespace=str(record["namespace"]),
        sandboxes=tuple(PlegSandbox(s["id"], s["state"], s["created_at"], s["attempt"], s["ip"],
                                    tuple(s["additional_ips"])) for s in record["sandboxes"]),
        containers=tuple(PlegContainer(
            c["id"], c["name"], c["state"], c["sandbox_id"], c["attempt"], c["created_at"],
            c["started_at"], c["finished_at"], c["exit_code"], c["reason"], c["message"],
            c["image"], c["image_ref"], c["hash"], c["restart_count"], c["log_path"])
            for c in record["containers"]))
