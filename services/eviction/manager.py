"""The eviction manager's pass (the kubelet's ``eviction_manager.go`` ``synchronize``), with
its I/O outside: ``EvictionManager.decide(now, observations, pods)`` is pure over its own
state and returns the node conditions and at most one eviction.

One pass: the thresholds met (and, for those met on the last pass, still within
``evictionMinimumReclaim``), the node conditions (held ``evictionPressureTransitionPeriod``
after last met), the thresholds whose grace period passed; then local storage limits (an
emptyDir over its ``sizeLimit``, a pod or container over its ``ephemeral-storage`` limit: such
pods are evicted at once, and nothing else this pass); then, with a threshold to act on
(memory first), the first pod of the ranking for its resource. One pod per pass, and none
while an earlier eviction is not done (at most ``CLEANUP_WAIT``), as the kubelet waits for
the pod's cleanup.

A threshold whose signal has node-level reclaim (``reclaim.py``: the disk signals) first
returns ``Decision.reclaim`` instead of an eviction; once the reclaim is done the caller reads
the signals again and calls ``after_reclaim``, which evicts the pod the pass ranked (its usage
and message as the pass read them, as the kubelet's) only if a threshold is still met with its
minimum reclaim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from podvisor.services.eviction.rank import (
    Eviction,
    PodUsage,
    eviction_message,
    local_storage_violation,
    rank,
)
from podvisor.services.eviction.reclaim import ReclaimFuncs, reclaim_sufficed
from podvisor.services.eviction.signals import Observation, Observations
from podvisor.services.eviction.thresholds import (
    PressureState,
    Threshold,
    by_eviction_priority,
    evaluate,
)

HARD_GRACE = 1  # seconds a pod gets under a hard threshold (newer kubelets' 1 s; older 0)
CLEANUP_WAIT = 30.0  # the kubelet's podCleanupTimeout


@dataclass(frozen=True)
class Decision:
    conditions: tuple[str, ...]
    evictions: tuple[Eviction, ...] = ()
    acting_on: tuple[str, ...] = ()  # the thresholds past their grace period (describe())
    # the resource the pass attempts to reclaim (the kubelet's EvictionThresholdMet event)
    starved: str = ""
    # node-level reclaim to ask for first (reclaim.py), then ``after_reclaim``
    reclaim: tuple[str, ...] = ()
    reclaimed: bool = False  # after_reclaim: the reclaim sufficed, no pod evicted
    signal: str = ""  # the signal of the threshold acted on (with ``reclaim``)


@dataclass(frozen=True)
class _Pending:
    """A pass waiting for its node-level reclaim."""

    threshold: Threshold
    observation: Observation
    conditions: tuple[str, ...]
    acting: tuple[str, ...]
    pods: tuple[PodUsage, ...]


@dataclass
class EvictionManager:
    thresholds: Sequence[Threshold]
    transition: float = 300.0  # evictionPressureTransitionPeriod
    max_pod_grace: int = 0  # evictionMaxPodGracePeriod
    reclaim_funcs: ReclaimFuncs = field(default_factory=dict)  # signal -> node-level reclaim
    state: PressureState = field(default_factory=lambda: PressureState([], {}, {}))
    waiting: dict[str, float] = field(default_factory=dict)  # uid -> evicted at (monotonic)
    pending: _Pending | None = None

    def done(self, uid: str) -> None:
        """The evicted pod is down (its worker terminated, or it is gone)."""
        self.waiting.pop(uid, None)

    def decide(self, now: float, obs: Observations, pods: Sequence[PodUsage]) -> Decision:
        act, conditions, self.state = evaluate(self.thresholds, obs, self.state, now,
                                               self.transition)
        acting = tuple(t.describe() for t in act)
        self.waiting = {uid: at for uid, at in self.waiting.items()
                        if now - at < CLEANUP_WAIT}
        local = tuple(Eviction(p.uid, p.name, msg, HARD_GRACE, "local-storage")
                      for p in pods if not p.critical and p.uid not in self.waiting
                      and (msg := local_storage_violation(p)))
        if local:
            return self._evicting(now, conditions, local, acting)
        if not act or self.waiting:
            return Decision(tuple(conditions), (), acting)
        threshold = by_eviction_priority(act)[0]
        pending = _Pending(threshold, obs[threshold.signal], tuple(conditions), acting,
                           tuple(pods))
        if funcs := tuple(self.reclaim_funcs.get(threshold.signal, ())):
            self.pending = pending
            return Decision(pending.conditions, (), acting, threshold.resource, funcs,
                            signal=threshold.signal)
        return self._rank_and_evict(now, pending)

    def after_reclaim(self, obs: Observations, now: float) -> Decision:
        """The pass that asked for a reclaim, with the signals read after it: no eviction if
        no threshold is met any more (minimum reclaim included), else the ranked pod."""
        pending, self.pending = self.pending, None
        if pending is None:
            return Decision(())
        if reclaim_sufficed(self.thresholds, obs):
            return Decision(pending.conditions, (), pending.acting,
                            pending.threshold.resource, reclaimed=True)
        return self._rank_and_evict(now, pending)

    def _rank_and_evict(self, now: float, p: _Pending) -> Decision:
        threshold, o = p.threshold, p.observation
        for pod in rank(threshold.resource, p.pods):
            grace = HARD_GRACE if threshold.hard else min(self.max_pod_grace,
                                                          pod.termination_grace)
            eviction = Eviction(pod.uid, pod.name,
                                eviction_message(threshold, o.available, o.capacity, pod),
                                grace)
            return self._evicting(now, p.conditions, (eviction,), p.acting, threshold.resource)
        return Decision(p.conditions, (), p.acting, threshold.resource)

    def _evicting(self, now: float, conditions: Sequence[str],
                  evictions: tuple[Eviction, ...], acting: tuple[str, ...],
                  starved: str = "") -> Decision:
        for e in evictions:
            self.waiting[e.uid] = now
        return Decision(tuple(conditions), evictions, acting, starved)
