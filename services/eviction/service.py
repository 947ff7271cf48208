"""The eviction service: every ``evictionMonitoringPeriod`` it reads the signals and the pods'
usage, lets ``EvictionManager`` decide, sets the ``pressure`` map (the node conditions) and
asks the sync loop to fail the pod it chose (``FailPod``, reason ``Evicted``), republished
until the pod's ``desired`` entry says failed (the bus may drop a message).

A pass that acts on a threshold records the kubelet's Warning ``EvictionThresholdMet``
("Attempting to reclaim ephemeral-storage") on the Node. When its signal has node-level
reclaim it asks ``imagegc`` first (``ReclaimNodeResources``, republished until the answer
``NodeResourcesReclaimed`` with its id, or at most ``RECLAIM_WAIT``), reads the signals again
and lets ``EvictionManager.after_reclaim`` decide; a Normal ``NodeResourcesReclaimed`` event
on the Node says what went and the outcome in the kubelet's log words ("able to reduce
resource pressure without evicting pods." / "must evict pod(s) to reclaim <resource>.").
No pass runs while a reclaim is under way."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from podvisor.common.logs import Log
from podvisor.ipc.bus import Publisher
from podvisor.ipc.clone import MapOwner
from podvisor.ipc.maps import PRESSURE_KEY, DesiredPod, NodePressure, PlegPod
from podvisor.ipc.messages import FailPod, NodeResourcesReclaimed, ReclaimNodeResources
from podvisor.services.eviction.manager import Decision, EvictionManager
from podvisor.services.eviction.rank import Eviction, PodUsage
from podvisor.services.eviction.reclaim import CONTAINERS, IMAGES
from podvisor.services.eviction.signals import Observations

REASON = "Evicted"
RESEND = 0.5  # a FailPod not yet taken (a reclaim not yet answered) is published again this often
RECLAIM_WAIT = 30.0  # a reclaim not answered by then: the pass goes on without it


@dataclass
class Reclaiming:
    """A reclaim asked for and not yet answered."""

    request: ReclaimNodeResources
    resource: str
    deadline: float
    answer: NodeResourcesReclaimed | None = None


class EventSink:
    """record(type, reason, message, obj) + flush(): the events package's Recorder and
    publisher, or a list in tests."""

    def __init__(self, record: Callable[[str, str, str, Mapping[str, object]], None],
                 flush: Callable[[], object]) -> None:
        self.record = record
        self.flush = flush


@dataclass
class Inputs:
    """Where one pass reads from (the loop's replicas and the machine)."""

    observe: Callable[[], Observations]
    desired: Callable[[], Mapping[str, DesiredPod]]
    pleg: Callable[[], Mapping[str, PlegPod]]
    usage: Callable[[Mapping[str, DesiredPod], Mapping[str, PlegPod]], list[PodUsage]]
    wall: Callable[[], float]


class EvictionService:
    def __init__(self, manager: EvictionManager, inputs: Inputs, pressure: MapOwner[NodePressure],
                 publisher: Publisher, log: Log, period: float,
                 events: EventSink | None = None, node: str = "") -> None:
        self.manager, self.inputs, self.pressure = manager, inputs, pressure
        self.publisher, self.log, self.period = publisher, log, period
        self.events = events or EventSink(lambda *_: None, lambda: None)
        self.node = {"kind": "Node", "name": node}
        self.next_pass = 0.0
        self.asked: dict[str, Eviction] = {}  # evictions the sync loop has not taken yet
        self.conditions: tuple[str, ...] | None = None
        self.reclaiming: Reclaiming | None = None
        self.reclaims = 0  # requests made (their ids)
        self.prefix = secrets.token_hex(4)  # a restarted process's ids differ

    def answered(self, answer: NodeResourcesReclaimed) -> None:
        """imagegc's answer (any process's: only the one naming the request counts)."""
        r = self.reclaiming
        if r is not None and r.answer is None and answer.id == r.request.id:
            r.answer = answer

    def step(self, now: float) -> float:
        desired = self.inputs.desired()
        self._follow(desired)
        wake = self._reclaim_step(now)
        if self.reclaiming is None and now >= self.next_pass:
            self.next_pass = now + self.period
            self._pass(now, desired)
            wake = self._reclaim_step(now)
        for e in self.asked.values():
            self.publisher.publish(FailPod(uid=e.uid, reason=REASON, message=e.message,
                                           grace=e.grace, event_type="Warning"))
        self.events.flush()
        due = min(self.next_pass, now + RESEND) if self.asked else self.next_pass
        return min(due, wake) if wake is not None else due

    def _reclaim_step(self, now: float) -> float | None:
        """Ask again, or finish the pass once answered (or past ``RECLAIM_WAIT``); the next
        wake-up while one is under way."""
        r = self.reclaiming
        if r is None:
            return None
        if r.answer is None and now < r.deadline:
            self.publisher.publish(r.request)
            return min(now + RESEND, r.deadline)
        self.reclaiming = None
        self.next_pass = now + self.period  # the pass ends here: the next one a period on
        if r.answer is None:
            self.log.warning("eviction.reclaim.unanswered", request=r.request.id,
                             waited=RECLAIM_WAIT, reason="no answer from imagegc")
        decision = self.manager.after_reclaim(self.inputs.observe(), now)
        a = r.answer or NodeResourcesReclaimed(id=r.request.id, errors="no answer")
        outcome = ("able to reduce resource pressure without evicting pods."
                   if decision.reclaimed else f"must evict pod(s) to reclaim {r.resource}.")
        if r.answer is None:
            outcome = f"imagegc did not answer; {outcome}"
        self.log.info("eviction.reclaim.done", request=r.request.id, resource=r.resource,
                      reclaimed=decision.reclaimed, containers=a.containers,
                      sandboxes=a.sandboxes, images=a.images, image_bytes=a.image_bytes,
                      errors=a.errors, message=f"Eviction manager: {outcome}")
        self.events.record("Normal", "NodeResourcesReclaimed",
                           f"Deleted {a.containers} unused containers and {a.images} unused "
                           f"images ({a.image_bytes} bytes) to reclaim {r.resource}: {outcome}",
                           self.node)
        self._evict(decision)
        return None

    def _follow(self, desired: Mapping[str, DesiredPod]) -> None:
        """Forget what the sync loop took; tell the manager which evicted pods are down."""
        for uid in list(self.asked):
            d = desired.get(uid)
            if d is None or (d.failed and d.reason == REASON):
                del self.asked[uid]
        for uid in list(self.manager.waiting):
            d = desired.get(uid)
            if d is None or not d.active:
                self.manager.done(uid)

    def _pass(self, now: float, desired: Mapping[str, DesiredPod]) -> None:
        obs = self.inputs.observe()
        pods = self.inputs.usage(desired, self.inputs.pleg())
        decision = self.manager.decide(now, obs, pods)
        if decision.conditions != self.conditions:
            self.log.info("eviction.conditions", conditions=list(decision.conditions),
                          thresholds=list(decision.acting_on))
            self.conditions = decision.conditions
            self.pressure.set(PRESSURE_KEY, NodePressure(decision.conditions, self.inputs.wall()))
        if decision.starved:
            self.log.info("eviction.reclaim.attempt", resource=decision.starved,
                          message="Eviction manager: attempting to reclaim")
            self.events.record("Warning", "EvictionThresholdMet",
                               f"Attempting to reclaim {decision.starved}", self.node)
        if decision.reclaim:
            self.reclaims += 1
            request = ReclaimNodeResources(
                id=f"{self.prefix}-{self.reclaims}", signal=decision.signal,
                containers=CONTAINERS in decision.reclaim, images=IMAGES in decision.reclaim,
                ts=self.inputs.wall())
            self.log.info("eviction.reclaim.asked", request=request.id,
                          resource=decision.starved, reclaim=list(decision.reclaim))
            self.reclaiming = Reclaiming(request, decision.starved, now + RECLAIM_WAIT)
            return
        self._evict(decision)

    def _evict(self, decision: Decision) -> None:
        for e in decision.evictions:
            self.log.warning("eviction.pod.evicted", pod=e.name, pod_uid=e.uid, why=e.why,
                             message=e.message, grace=e.grace)
            self.asked[e.uid] = e
