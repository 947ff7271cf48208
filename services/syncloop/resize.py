"""In-place pod resize (InPlacePodVerticalScaling, beta and on by default in 1.33): pure decisions.

A running pod whose containers' CPU or memory (requests, limits) changed is not a new pod. As
the kubelet's ``handlePodResourcesResize`` / ``canResizePod`` and kuberuntime's
``computePodResizeAction`` do it:

- ``allocated``: what the node granted each container (``allocation.py`` keeps it on disk, the
  kubelet's allocation checkpoint). A pod's first sync allocates its spec as it is; later, a
  spec whose CPU/memory differ from the allocation is a resize request, decided by
  ``decide``: ``ACCEPT`` (the allocation becomes the spec), ``INFEASIBLE`` (more than the
  node has at all: ``Node didn't have enough capacity: cpu, requested: 5000, capacity: 4000``;
  or a change the API server refuses for API pods, checked here for pods of other sources:
  the QoS class may not change, a memory limit may not go down unless its resizePolicy is
  RestartContainer, requests and limits may not be removed) or ``DEFERRED`` (it would fit an
  empty node, not beside the other pods: the admission message, ``Node didn't have enough
  resource: memory, requested: ..., used: ..., capacity: ...``). Either refusal is the pod's
  ``PodResizePending`` condition with that reason and message, and the pod runs on with its
  allocation; a deferred resize is decided again at every sync.
- The sync runs the pod with its allocated resources (``allocated_pod``); a running
  container whose actual resources (``actuated``: what it was created with or last updated
  to) differ from its allocation is resized (``plan``): restarted when a changed resource's
  ``resizePolicy`` is RestartContainer, else updated in place with UpdateContainerResources.
  Until every running container has its allocation the pod shows ``PodResizeInProgress``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from podvisor.common.quantity import format_cpu, format_memory
from podvisor.services.pod import (
    Container,
    Pod,
    ResourceList,
    Resources,
    qos_class,
)
from podvisor.services.syncloop.admission import Capacity, pod_requests
from podvisor.services.syncloop.runtime_state import ContainerState, PodRuntime

# a container's CPU/memory as plain data (the checkpoint's and the status's form):
# {"requests": {"cpu": millis, "memory": bytes}, "limits": {...}}, absent keys unset
Amounts = dict[str, dict[str, int]]

INFEASIBLE, DEFERRED = "Infeasible", "Deferred"
PENDING_CONDITION, IN_PROGRESS_CONDITION = "PodResizePending", "PodResizeInProgress"
QOS_MESSAGE = "Pod QOS Class may not change as a result of resizing"
MEMORY_DECREASE = "memory limits cannot be decreased unless resizePolicy is RestartContainer"
REMOVAL = "resource removal is not supported"


def amounts(r: Resources) -> Amounts:
    """The CPU and memory of ``r`` (the only resources a resize changes)."""
    out: Amounts = {}
    for part, rl in (("requests", r.requests), ("limits", r.limits)):
        got = {k: v for k, v in (("cpu", rl.cpu_millis), ("memory", rl.memory_bytes))
               if v is not None}
        if got:
            out[part] = got
    return out


def _amount(a: Amounts, part: str, key: str) -> int | None:
    """``a``'s ``part`` ("requests"/"limits") of ``key`` ("cpu"/"memory"), None unset."""
    got = a.get(part)
    return got.get(key) if got is not None else None


def with_amounts(r: Resources, a: Mapping[str, Mapping[str, int]]) -> Resources:
    """``r`` with its CPU and memory replaced by ``a`` (hugepages, storage kept)."""
    def rl(old: ResourceList, part: str) -> ResourceList:
        got = a.get(part, {})
        return replace(old, cpu_millis=got.get("cpu"), memory_bytes=got.get("memory"))
    return Resources(limits=rl(r.limits, "limits"), requests=rl(r.requests, "requests"))


def resizable(pod: Pod) -> tuple[Container, ...]:
    """The containers a resize may change: the sidecars and the regular containers (an init
    container that runs to completion keeps its resources, as the API server's rule)."""
    return (*pod.spec.sidecars, *pod.spec.containers)


def pod_amounts(pod: Pod) -> dict[str, Amounts]:
    """Container name -> its CPU/memory, for the containers a resize may change."""
    return {c.name: amounts(c.resources) for c in resizable(pod)}


def allocated_pod(pod: Pod, allocated: Mapping[str, Amounts]) -> Pod:
    """``pod`` with each resizable container's CPU/memory as allocated (containers with no
    allocation keep their spec)."""
    if all(allocated.get(c.name, amounts(c.resources)) == amounts(c.resources)
           for c in resizable(pod)):
        return pod

    def alloc(c: Container) -> Container:
        if c.name not in allocated:
            return c
        return replace(c, resources=with_amounts(c.resources, allocated[c.name]))

    return replace(pod, spec=replace(
        pod.spec, containers=tuple(alloc(c) for c in pod.spec.containers),
        init_containers=tuple(alloc(c) if c.sidecar else c for c in pod.spec.init_containers)))


class Verdict(StrEnum):
    NONE = "none"          # the spec is the allocation: nothing to decide
    ACCEPT = "accept"      # allocate the spec
    INFEASIBLE = INFEASIBLE
    DEFERRED = DEFERRED


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    message: str = ""

    @property
    def pending(self) -> bool:
        return self.verdict in (Verdict.INFEASIBLE, Verdict.DEFERRED)


def _api_rule(pod: Pod, current: Pod) -> str:
    """What the API server's ``ValidatePodResize`` refuses (pods of other sources reach the
    sync loop without it): "" when the change is one it allows."""
    if qos_class(pod) != qos_class(current):
        return QOS_MESSAGE
    old = {c.name: c for c in resizable(current)}
    for c in resizable(pod):
        before = old.get(c.name)
        if before is None:
            continue
        was, now = amounts(before.resources), amounts(c.resources)
        for part, got in was.items():
            if any(k not in now.get(part, {}) for k in got):
                return REMOVAL
        old_mem = _amount(was, "limits", "memory")
        new_mem = _amount(now, "limits", "memory")
        if old_mem is not None and new_mem is not None and new_mem < old_mem \
                and not c.resize_restart("memory"):
            return MEMORY_DECREASE
    return ""


def decide(pod: Pod, current: Pod, others: Iterable[Pod], capacity: Capacity,
           api: bool) -> Decision:
    """Can ``pod`` (the spec) replace ``current`` (the pod with its allocated resources)?
    ``others``: the other active pods, with their allocated resources; ``capacity``: the
    node's allocatable; ``api``: the pod came through the API server, which checked its rules
    already."""
    if pod_amounts(pod) == pod_amounts(current):
        return Decision(Verdict.NONE)
    if not api and (why := _api_rule(pod, current)):
        return Decision(Verdict.INFEASIBLE, why)
    if qos_class(pod) != qos_class(current):  # an API server that let it through
        return Decision(Verdict.INFEASIBLE, QOS_MESSAGE)
    cpu, mem = pod_requests(pod)
    if cpu > capacity.cpu_millis or mem > capacity.memory_bytes:
        what = (f"memory, requested: {mem}, capacity: {capacity.memory_bytes}"
                if mem > capacity.memory_bytes else
                f"cpu, requested: {cpu}, capacity: {capacity.cpu_millis}")
        return Decision(Verdict.INFEASIBLE, f"Node didn't have enough capacity: {what}")
    used = [pod_requests(p) for p in others if p.uid != pod.uid]
    used_cpu, used_mem = sum(u[0] for u in used), sum(u[1] for u in used)
    for resource, want, busy, cap in (("cpu", cpu, used_cpu, capacity.cpu_millis),
                                      ("memory", mem, used_mem, capacity.memory_bytes)):
        if want and busy + want > cap:
            return Decision(Verdict.DEFERRED,
                            f"Node didn't have enough resource: {resource}, requested: "
                            f"{want}, used: {busy}, capacity: {cap}")
    return Decision(Verdict.ACCEPT)


def changed_resources(want: Amounts, have: Amounts) -> set[str]:
    """The resources ("cpu", "memory") whose request or limit differ."""
    out = set()
    for part in ("requests", "limits"):
        for key in ("cpu", "memory"):
            if _amount(want, part, key) != _amount(have, part, key):
                out.add(key)
    return out


@dataclass(frozen=True)
class ResizePlan:
    """What a sync does to bring running containers to their allocation."""

    update: tuple[tuple[str, str], ...] = ()   # (container id, name): UpdateContainerResources
    restart: tuple[str, ...] = ()              # container ids: restart (RestartContainer)

    @property
    def empty(self) -> bool:
        return not (self.update or self.restart)


NO_RESIZE = ResizePlan()


def _needs_restart(c: Container, changed: set[str]) -> bool:
    return any(c.resize_restart(r) for r in changed)


def plan(pod: Pod, rt: PodRuntime, actuated: Mapping[str, Amounts]) -> ResizePlan:
    """``pod`` with its allocated resources, ``rt`` its runtime state, ``actuated``: container
    ID -> the CPU/memory it runs with (an ID not in it: the allocation, nothing to do)."""
    update: list[tuple[str, str]] = []
    restart: list[str] = []
    for c in resizable(pod):
        status = rt.latest(c.name)
        if status is None or status.state is not ContainerState.RUNNING \
                or status.id not in actuated:
            continue
        changed = changed_resources(amounts(c.resources), actuated[status.id])
        if not changed:
            continue
        if _needs_restart(c, changed):
            restart.append(status.id)
        else:
            update.append((status.id, c.name))
    return ResizePlan(tuple(update), tuple(restart))


def to_quantities(a: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, str]]:
    """``a`` in the API's quantity form (``{"cpu": "500m", "memory": "128Mi"}``)."""
    return {part: {k: format_cpu(v) if k == "cpu" else format_memory(v)
                   for k, v in sorted(got.items())}
            for part, got in a.items() if got}


def from_wire(raw: Any) -> Amounts:
    """An ``Amounts`` read back from JSON/msgpack; anything malformed is dropped."""
    out: Amounts = {}
    if not isinstance(raw, Mapping):
        return out
    for part in ("requests", "limits"):
        got = raw.get(part)
        if isinstance(got, Mapping):
            vals = {k: int(v) for k, v in got.items()
                    if k in ("cpu", "memory") and isinstance(v, int) and not isinstance(v, bool)}
            if vals:
                out[part] = vals
    return out
