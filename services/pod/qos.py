"""QoS class and OOM score adjustment, as the kubelet computes them. Pure.

- ``qos_class(pod)``: ``ComputePodQOS`` (``pkg/apis/core/v1/helper/qos``): init and regular
  containers; only CPU and memory count; zero quantities count as unset; requests are already
  defaulted from limits (``Resources``).
- ``oom_score_adj(pod, container, memory_capacity)``: ``GetContainerOOMScoreAdjust``
  (``pkg/kubelet/qos/policy.go``): Guaranteed -997, BestEffort 1000, Burstable
  ``1000 - 1000 * memoryRequest / memoryCapacity`` kept within [3, 999] (the source's
  ``1000 + guaranteedOOMScoreAdj`` floor; the Kubernetes docs say 2).
"""

from __future__ import annotations

from enum import StrEnum

from podvisor.services.pod.container import Container
from podvisor.services.pod.model import Pod

GUARANTEED_OOM_SCORE_ADJ = -997
BEST_EFFORT_OOM_SCORE_ADJ = 1000
BURSTABLE_MIN_OOM_SCORE_ADJ = 1000 + GUARANTEED_OOM_SCORE_ADJ  # 3
BURSTABLE_MAX_OOM_SCORE_ADJ = BEST_EFFORT_OOM_SCORE_ADJ - 1  # 999


class QOSClass(StrEnum):
    GUARANTEED = "Guaranteed"
    BURSTABLE = "Burstable"
    BEST_EFFORT = "BestEffort"


def qos_class(pod: Pod) -> QOSClass:
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    guaranteed = True
    for c in pod.spec.containers + pod.spec.init_containers:
        req, lim = c.resources.requests, c.resources.limits
        for name, amount in (("cpu", req.cpu_millis), ("memory", req.memory_bytes)):
            if amount:  # None or 0: not counted
                requests[name] = requests.get(name, 0) + amount
        found = set()
        for name, amount in (("cpu", lim.cpu_millis), ("memory", lim.memory_bytes)):
            if amount:
                found.add(name)
                limits[name] = limits.get(name, 0) + amount
        if found != {"cpu", "memory"}:
            guaranteed = False
    if not requests and not limits:
        return QOSClass.BEST_EFFORT
    if guaranteed and all(limits.get(k) == v for k, v in requests.items()) and (
            len(requests) == len(limits)):
        return QOSClass.GUARANTEED
    return QOSClass.BURSTABLE


def oom_score_adj(pod: Pod, container: Container, memory_capacity: int,
                  qos: QOSClass | None = None) -> int:
    """``memory_capacity``: the node's memory in bytes (> 0)."""
    qos = qos_class(pod) if qos is None else qos
    if qos is QOSClass.GUARANTEED:
        return GUARANTEED_OOM_SCORE_ADJ
    if qos is QOSClass.BEST_EFFORT:
        return BEST_EFFORT_OOM_SCORE_ADJ
    request = container.resources.requests.memory_bytes or 0
    adj = 1000 - (1000 * request) // max(1, memory_capacity)
    if adj < BURSTABLE_MIN_OOM_SCORE_ADJ:
        return BURSTABLE_MIN_OOM_SCORE_ADJ
    if adj == BEST_EFFORT_OOM_SCORE_ADJ:
        return BURSTABLE_MAX_OOM_SCORE_ADJ
    return adj
