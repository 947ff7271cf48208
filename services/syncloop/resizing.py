"""Applying an in-place resize in SyncPod (the kubelet's ``doPodResizeAction``): the side
effects of ``resize.py``'s plan, on a pool thread.

- Each running container to update in place gets UpdateContainerResources with its allocated
  CPU shares, quota and memory limit (the same arithmetic as at create,
  ``cri_config.linux_resources``); what it runs with is recorded in the allocation checkpoint
  after the runtime answered (``AllocationStore.set_actuated``). A kill -9 in between applies
  it again on the next sync: the call is idempotent.
- The pod's own cgroup (``podcgroups.py``, both runtimes) is rewritten with the pod's new
  limits: before the containers when the pod's memory limit grows (a child may not outgrow
  its parent), after them when it shrinks, as the kubelet orders them.
- A failed update leaves the pod in progress with the runtime's error (the kubelet's
  ``PodResizeInProgress`` reason ``Error``), retried at the next sync.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from podvisor.common.logs import Log
from podvisor.services.cri import CriError, RuntimeClient
from podvisor.services.pod import Pod, qos_class
from podvisor.services.syncloop import cri_config
from podvisor.services.syncloop.allocation import AllocationStore
from podvisor.services.syncloop.podcgroups import PodCgroupError, PodCgroups, pod_limits
from podvisor.services.syncloop.resize import (
    NO_RESIZE,
    Amounts,
    ResizePlan,
    allocated_pod,
    amounts,
    plan,
    resizable,
)
from podvisor.services.syncloop.runtime_events import Effect, Effects
from podvisor.services.syncloop.runtime_state import ContainerState, PodRuntime


@dataclass(frozen=True)
class ResizeReport:
    """After a sync: what each running regular container runs with, and a failure."""

    actual: Mapping[str, Amounts] = field(default_factory=dict)
    error: str = ""


def actuated_by_id(store: AllocationStore, uid: str) -> dict[str, Amounts]:
    """Container ID -> what it runs with, from the checkpoint."""
    return {cid: a for cid, a in store.actuated(uid).values()}


def resize_plan(store: AllocationStore | None, pod: Pod, rt: PodRuntime) -> ResizePlan:
    if store is None:
        return NO_RESIZE
    return plan(pod, rt, actuated_by_id(store, pod.uid))


def report(store: AllocationStore | None, pod: Pod, rt: PodRuntime, error: str = "",
           effects: Effects | None = None) -> ResizeReport | None:
    """What the running regular containers run with after a sync that read ``rt`` and did
    ``effects`` (a container the checkpoint does not know runs with the allocation: it was
    created with it; one this sync started, likewise)."""
    if store is None:
        return None
    effects = effects or {}
    records = store.actuated(pod.uid)
    known = {cid: a for cid, a in records.values()}
    actual: dict[str, Amounts] = {}
    for c in resizable(pod):
        status = rt.latest(c.name)
        record = records.get(c.name)
        if record is not None and effects.get(record[0]) is Effect.STARTED:
            actual[c.name] = record[1]
        elif status is not None and status.state is ContainerState.RUNNING \
                and effects.get(status.id) is not Effect.STOPPED:
            actual[c.name] = known.get(status.id, amounts(c.resources))
    return ResizeReport(actual, error)


def _memory(pod: Pod) -> int | None:
    limits = pod_limits(pod, str(qos_class(pod)))
    return limits.memory_bytes if limits is not None else None


def _pod_cgroup(cgroups: PodCgroups | None, pod: Pod) -> None:
    if cgroups is not None:
        cgroups.ensure(pod, str(qos_class(pod)))


def apply_updates(client: RuntimeClient, store: AllocationStore, cgroups: PodCgroups | None,
                  log: Log, pod: Pod, todo: ResizePlan,
                  crash: Callable[[], None] = lambda: None) -> str:
    """UpdateContainerResources for ``todo.update`` and the pod's cgroup around them; returns
    the first error ("" none). ``pod``: with its allocated resources. A restart in ``todo``
    needs the pod's cgroup only (the new container is created with its allocation)."""
    known = actuated_by_id(store, pod.uid)
    before = allocated_pod(pod, {name: known[cid] for cid, name in todo.update})
    grows = (_memory(pod) or 0) >= (_memory(before) or 0) or _memory(pod) is None
    specs = {c.name: c for c in resizable(pod)}
    try:
        if grows:
            _pod_cgroup(cgroups, pod)
        for cid, name in todo.update:
            c = specs[name]
            client.update_container_resources(cid, cri_config.linux_resources(c))
            crash()  # fault tests: "syncloop:resize.after_update", before it is recorded
            store.set_actuated(pod.uid, name, cid, amounts(c.resources))
            log.info("syncloop.container.resized", pod=pod.full_name, pod_uid=pod.uid,
                     container=name, container_id=cid, resources=amounts(c.resources))
        if not grows:
            _pod_cgroup(cgroups, pod)
    except CriError as err:
        message = f"UpdateContainerResources failed: {err.message}"
        log.warning("syncloop.pod.resize.failed", pod=pod.full_name, pod_uid=pod.uid,
                    message=message)
        return message
    except PodCgroupError as err:
        message = f"pod cgroup: {err}"
        log.warning("syncloop.pod.resize.failed", pod=pod.full_name, pod_uid=pod.uid,
                    message=message)
        return message
    return ""
