"""Which pod goes first, and what its eviction says (the kubelet's ``eviction/helpers.go``:
``rankMemoryPressure``, ``rankDiskPressureFunc``, ``rankPIDPressure``, ``evictionMessage``).
Pure: pods and their usage come in as values.

Memory and disk: pods whose usage exceeds their requests first, then lower priority first, then
most usage above the request. With requests at zero for BestEffort, equal to the limits for
Guaranteed, that puts BestEffort before Burstable before Guaranteed in practice. PIDs: lower
priority first, then most processes. Critical pods (static and mirror pods, priority at least
2000000000) are never ranked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from podvisor.services.eviction.thresholds import Threshold, format_binary

CRITICAL_PRIORITY = 2_000_000_000  # scheduling.SystemCriticalPriority


@dataclass(frozen=True)
class ContainerUsage:
    """One container: its requests and what it uses (bytes; ``storage``: its logs and
    writable layer)."""

    name: str
    memory_request: int = 0
    memory: int = 0
    storage_request: int = 0
    storage: int = 0
    storage_limit: int | None = None


@dataclass(frozen=True)
class PodUsage:
    """One active pod as the eviction manager sees it. ``memory``: its cgroup's working set;
    ``storage``: its containers' plus its local volumes' bytes (``volumes``: emptyDir name ->
    (bytes used, sizeLimit or None)); ``inodes``; ``pids``: its processes now."""

    uid: str
    name: str
    priority: int = 0
    qos: str = "BestEffort"
    critical: bool = False
    memory: int = 0
    storage: int = 0
    inodes: int = 0
    pids: int = 0
    containers: tuple[ContainerUsage, ...] = ()
    volumes: tuple[tuple[str, int, int | None], ...] = ()
    termination_grace: int = 30

    @property
    def memory_request(self) -> int:
        return sum(c.memory_request for c in self.containers)

    @property
    def storage_request(self) -> int:
        return sum(c.storage_request for c in self.containers)

    @property
    def storage_limit(self) -> int | None:
        """The pod's ephemeral-storage limit: the sum of its containers' that have one
        (``PodLimits``); None when none has."""
        limits = [c.storage_limit for c in self.containers if c.storage_limit is not None]
        return sum(limits) if limits else None


Key = Callable[[PodUsage], tuple[int, ...]]


def _requests_key(usage: Callable[[PodUsage], int],
                  request: Callable[[PodUsage], int]) -> Key:
    def key(p: PodUsage) -> tuple[int, ...]:
        used, req = usage(p), request(p)
        return (0 if used > req else 1, p.priority, -(used - req))
    return key


def _rank(pods: Sequence[PodUsage], key: Key) -> list[PodUsage]:
    return sorted((p for p in pods if not p.critical), key=key)


def rank_memory(pods: Sequence[PodUsage]) -> list[PodUsage]:
    return _rank(pods, _requests_key(lambda p: p.memory, lambda p: p.memory_request))


def rank_storage(pods: Sequence[PodUsage]) -> list[PodUsage]:
    return _rank(pods, _requests_key(lambda p: p.storage, lambda p: p.storage_request))


def rank_inodes(pods: Sequence[PodUsage]) -> list[PodUsage]:
    return _rank(pods, lambda p: (0 if p.inodes > 0 else 1, p.priority, -p.inodes))


def rank_pids(pods: Sequence[PodUsage]) -> list[PodUsage]:
    return _rank(pods, lambda p: (p.priority, -p.pids))


RANKERS: dict[str, Callable[[Sequence[PodUsage]], list[PodUsage]]] = {
    "memory": rank_memory, "ephemeral-storage": rank_storage, "inodes": rank_inodes,
    "pids": rank_pids}


def rank(resource: str, pods: Sequence[PodUsage]) -> list[PodUsage]:
    """The pods in eviction order for a threshold on ``resource``."""
    return RANKERS.get(resource, rank_memory)(pods)


@dataclass(frozen=True)
class Eviction:
    """One pod to evict: ``grace`` (seconds) and the kubelet's ``message``."""

    uid: str
    name: str
    message: str
    grace: int
    why: str = field(default="threshold")  # "threshold" | "local-storage"


def eviction_message(t: Threshold, available: int, capacity: int, pod: PodUsage) -> str:
    """``The node was low on resource: memory. Threshold quantity: 100Mi, available: 90Mi.
    Container c was using 150Mi, request is 0, has larger consumption of memory. ``"""
    resource = t.resource
    msg = f"The node was low on resource: {resource}. "
    msg += (f"Threshold quantity: {t.quantity_text(capacity)}, available: "
            f"{format_binary(available)}. ")
    for c in pod.containers:
        if resource == "memory":
            used, req = c.memory, c.memory_request
        elif resource == "ephemeral-storage":
            used, req = c.storage, c.storage_request
        else:
            continue
        if used > req:
            msg += (f"Container {c.name} was using {format_binary(used)}, request is "
                    f"{format_binary(req)}, has larger consumption of {resource}. ")
    return msg


def local_storage_violation(pod: PodUsage) -> str:
    """The kubelet's message when the pod broke a local storage limit (an emptyDir's
    ``sizeLimit``, its containers' total ``ephemeral-storage`` limit, one container's), else
    ''."""
    for name, used, limit in pod.volumes:
        if limit is not None and used > limit:
            return (f'Usage of EmptyDir volume "{name}" exceeds the limit '
                    f'"{format_binary(limit)}". ')
    total = pod.storage_limit
    if total is not None and pod.storage > total:
        return ("Pod ephemeral local storage usage exceeds the total limit of containers "
                f"{format_binary(total)}. ")
    for c in pod.containers:
        if c.storage_limit is not None and c.storage > c.storage_limit:
            return (f"Container {c.name} exceeded its local ephemeral storage limit "
                    f'"{format_binary(c.storage_limit)}". ')
    return ""
