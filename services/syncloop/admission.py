"""Admission before a pod's first sync (the kubelet's canAdmitPod, narrowed).

Pure: ``admit(pod, admitted_pods, capacity)`` returns None or the rejection (reason, message). A
rejected pod never starts; its ``desired`` entry says ``admitted: false`` and status reports
phase Failed.

With ``capacity`` (the Node's allocatable; given when the agent is a cluster node, i.e.
``kubeconfig`` is set) the kubelet's resource fit (noderesources.Fits) runs too: the number of
admitted pods must stay below ``maxPods`` (``OutOfpods``), and the pod's requests plus those of
the admitted pods must fit the allocatable CPU and memory (``OutOfcpu``, ``OutOfmemory``). A
pod's request per resource is max(sum over its containers, largest init container), as
``resource.PodRequests`` computes it. The message is the kubelet's: ``Node didn't have enough
resource: cpu, requested: 500, used: 1500, capacity: 2000`` (millicores, bytes, pods).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from podvisor.services.pod import Pod, QOSClass, qos_class
from podvisor.services.syncloop.cri_config import host_ports


@dataclass(frozen=True)
class Rejection:
    reason: str
    message: str


def _clash(a: tuple[str, int, str], b: tuple[str, int, str]) -> bool:
    """The scheduler's HostPortInfo: one protocol and port, and one address or either on
    every address (0.0.0.0)."""
    return a[:2] == b[:2] and (a[2] == b[2] or "0.0.0.0" in (a[2], b[2]))


def _name(key: tuple[str, int, str]) -> str:
    return f"{key[1]}/{key[0]}" + ("" if key[2] == "0.0.0.0" else f" on {key[2]}")


def _port_conflicts(pod: Pod, others: Iterable[Pod]) -> list[str]:
    mine = host_ports(pod)
    if not mine:  # most pods: no need to look at the others (O(pods) per admission)
        return []
    hits = []
    for other in others:
        if other.uid == pod.uid:
            continue
        theirs = host_ports(other)
        for key in sorted(set(mine)):
            if any(_clash(key, t) for t in theirs):
                hits.append(f"{_name(key)} (used by {other.full_name})")
    return hits


def _duplicate_ports(pod: Pod) -> list[str]:
    seen: list[tuple[str, int, str]] = []
    dups = []
    for key in host_ports(pod):
        if any(_clash(key, s) for s in seen):
            dups.append(_name(key))
        seen.append(key)
    return dups


@dataclass(frozen=True)
class Capacity:
    """The Node's allocatable: CPU in millicores, memory in bytes, pods."""

    cpu_millis: int
    memory_bytes: int
    pods: int


def pod_requests(pod: Pod) -> tuple[int, int]:
    """(CPU millicores, memory bytes) the pod requests."""
    cpu = sum(c.resources.requests.cpu_millis or 0 for c in pod.spec.containers)
    mem = sum(c.resources.requests.memory_bytes or 0 for c in pod.spec.containers)
    for c in pod.spec.init_containers:
        cpu = max(cpu, c.resources.requests.cpu_millis or 0)
        mem = max(mem, c.resources.requests.memory_bytes or 0)
    return cpu, mem


def _fits(pod: Pod, admitted: list[Pod], capacity: Capacity) -> Rejection | None:
    def short(resource: str, requested: int, used: int, cap: int) -> Rejection:
        return Rejection(f"OutOf{resource}", f"Node didn't have enough resource: {resource}, "
                         f"requested: {requested}, used: {used}, capacity: {cap}")

    if len(admitted) + 1 > capacity.pods:
        return short("pods", 1, len(admitted), capacity.pods)
    cpu, mem = pod_requests(pod)
    used = [pod_requests(p) for p in admitted]
    used_cpu, used_mem = sum(u[0] for u in used), sum(u[1] for u in used)
    if cpu and used_cpu + cpu > capacity.cpu_millis:
        return short("cpu", cpu, used_cpu, capacity.cpu_millis)
    if mem and used_mem + mem > capacity.memory_bytes:
        return short("memory", mem, used_mem, capacity.memory_bytes)
    return None


CRITICAL_PRIORITY = 2_000_000_000  # scheduling.SystemCriticalPriority
MEMORY_PRESSURE_TAINT = "node.kubernetes.io/memory-pressure"


def _tolerates_memory_pressure(pod: Pod) -> bool:
    """``ToleratesTaint`` of node.kubernetes.io/memory-pressure:NoSchedule (no value)."""
    for t in pod.spec.tolerations:
        if t.effect not in ("", "NoSchedule"):
            continue
        if not t.key and t.operator == "Exists":
            return True
        if t.key == MEMORY_PRESSURE_TAINT and (t.operator == "Exists" or not t.value):
            return True
    return False


def pressure_rejection(pod: Pod, conditions: Sequence[str]) -> Rejection | None:
    """The kubelet's eviction admit handler: under any node pressure condition a new pod is
    refused (reason ``Evicted``, ``The node had condition: [DiskPressure]. ``), but a critical
    one (a static pod, priority >= 2000000000); under MemoryPressure alone only a BestEffort
    pod that does not tolerate the memory-pressure taint."""
    if not conditions:
        return None
    static = pod.origin is not None and pod.origin.source != "api"
    if static or pod.spec.priority >= CRITICAL_PRIORITY:
        return None  # critical: a static pod (from a file or URL), or by priority
    if list(conditions) == ["MemoryPressure"] and (
            qos_class(pod) is not QOSClass.BEST_EFFORT or _tolerates_memory_pressure(pod)):
        return None
    return Rejection("Evicted", f"The node had condition: [{' '.join(conditions)}]. ")


# the kubelet's nodeshutdown manager's Admit (nodeShutdownNotAdmittedReason/Message)
NODE_SHUTDOWN_REJECTED = Rejection("NodeShutdown",
                                   "Pod was rejected as the node is shutting down.")


def admit(pod: Pod, admitted: Iterable[Pod], capacity: Capacity | None = None,
          pressure: Sequence[str] = (), shutting_down: bool = False) -> Rejection | None:
    """Check ``pod`` against the pods already admitted on this node (and, with ``capacity``,
    against the Node's allocatable; with ``pressure``, the node conditions the eviction
    manager holds True; ``shutting_down``: a graceful node shutdown is under way, the
    ``node-shutdown`` map's ``active``). The checks go in the kubelet's handler order:
    eviction's, the resource fit and host ports, then the node shutdown manager's (which
    refuses every pod, a critical or static one too)."""
    if (rejection := pressure_rejection(pod, pressure)) is not None:
        return rejection
    if capacity is not None:
        admitted = [p for p in admitted if p.uid != pod.uid]
        if (rejection := _fits(pod, admitted, capacity)) is not None:
            return rejection
    if not pod.spec.containers:
        return Rejection("UnsupportedPod", "the pod has no containers")
    if dups := _duplicate_ports(pod):
        return Rejection("HostPortConflict",
                         f"the pod claims host port(s) more than once: {', '.join(dups)}")
    if conflicts := _port_conflicts(pod, admitted):
        return Rejection("HostPortConflict",
                         "host port(s) already in use on this node: " + ", ".join(conflicts))
    if shutting_down:
        return NODE_SHUTDOWN_REJECTED
    return None
