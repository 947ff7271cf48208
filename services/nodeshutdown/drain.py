"""The drain of a graceful node shutdown, as pure decisions (no I/O): which pods to fail now,
with which grace, and when the next group starts (kubelet ``nodeshutdown_manager_linux.go``
``processShutdownEvent``/``groupByPriority``).

Pods are split into the priority groups (each pod joins the group of the highest priority not
above its own; one below every group joins the first), and the groups go in ascending
priority: each pod of a group is failed (``FailPod``, reason ``Terminated``) with grace
``min(group seconds, its terminationGracePeriodSeconds)``; the next group starts once every
pod of this one is terminated or the group's seconds ran out (its requests went out at least
once). ``cap`` (logind's ``InhibitDelayMaxSec``) bounds the whole drain: when the groups'
seconds add up to more, each group gets its share of the cap (seconds * cap / total).
A ``FailPod`` is published again (every ``REPUBLISH`` s) until ``desired`` says the pod
failed: the bus may drop it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from podvisor.common.shutdownkeys import ShutdownGroup
from podvisor.ipc.maps import NODE_SHUTDOWN_MESSAGE, NODE_SHUTDOWN_REASON, DesiredPod
from podvisor.ipc.messages import FailPod
from podvisor.services.pod import pod_from_wire

__all__ = ["Drain", "group_of"]

REPUBLISH = 1.0


def group_of(groups: list[ShutdownGroup], priority: int) -> int:
    """The index of the group a pod of ``priority`` belongs to (``groups`` ascending)."""
    index = 0
    for i, g in enumerate(groups):
        if priority >= g.priority:
            index = i
    return index


@dataclass
class Drain:
    """One graceful node shutdown: ``step`` says which ``FailPod`` to publish now."""

    groups: list[ShutdownGroup]
    started: float
    cap: float | None = None  # InhibitDelayMaxSec: the groups' seconds scaled to fit in it
    current: int = -1
    deadline: float = 0.0
    members: list[str] = field(default_factory=list)
    graces: dict[str, int] = field(default_factory=dict)
    sent: dict[str, float] = field(default_factory=dict)  # uid -> when its FailPod went
    failed: int = 0

    def __post_init__(self) -> None:
        total = sum(g.seconds for g in self.groups)
        if self.cap is not None and total > self.cap:  # each group its share of the cap
            self.groups = [ShutdownGroup(g.priority, int(g.seconds * self.cap / total))
                           for g in self.groups]

    @property
    def done(self) -> bool:
        return self.current >= len(self.groups)

    def _start_next(self, now: float, pods: Mapping[str, DesiredPod]) -> None:
        self.current += 1
        if self.done:
            return
        group = self.groups[self.current]
        self.members = []
        for uid, desired in sorted(pods.items()):
            if desired.worker == "terminated" and not desired.failed:
                continue  # already ended (Succeeded, or stopped): nothing to terminate
            if not desired.admitted:
                continue  # refused at admission (NodeShutdown, say): it never ran
            spec = pod_from_wire(desired.pod).spec
            if group_of(self.groups, spec.priority) == self.current:
                self.members.append(uid)
                self.graces[uid] = min(group.seconds, spec.termination_grace_period_seconds)
        self.deadline = now + group.seconds

    def pending(self, pods: Mapping[str, DesiredPod]) -> list[str]:
        """The current group's pods not yet terminated."""
        return [uid for uid in self.members
                if uid in pods and pods[uid].worker != "terminated"]

    def step(self, now: float, pods: Mapping[str, DesiredPod]) -> list[FailPod]:
        """The ``FailPod`` requests due now; moves to the next group when this one is over."""
        if self.current < 0:
            self._start_next(now, pods)
        while not self.done:
            pending = self.pending(pods)
            if pending and (now < self.deadline or any(u not in self.sent for u in pending)):
                break  # a group past its time still gets its requests once
            self._start_next(now, pods)
        if self.done:
            return []
        out = []
        for uid in self.pending(pods):
            desired = pods[uid]
            if desired.failed and desired.reason == NODE_SHUTDOWN_REASON:
                continue  # taken: the sync loop is stopping it
            if now - self.sent.get(uid, float("-inf")) < REPUBLISH:
                continue
            if uid not in self.sent:
                self.failed += 1
            self.sent[uid] = now
            out.append(FailPod(uid=uid, reason=NODE_SHUTDOWN_REASON,
                               message=NODE_SHUTDOWN_MESSAGE, grace=self.graces[uid],
                               event_type="Normal"))
        return out

    def next_wake(self, now: float) -> float:
        return now if self.done else min(self.deadline, now + REPUBLISH)
