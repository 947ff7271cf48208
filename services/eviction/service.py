"""The eviction service: every ``evictionMonitoringPeriod`` it reads the signals and the pods'
usage, lets ``EvictionManager`` decide, sets the ``pressure`` map (the node conditions) and
asks the sync loop to fail the pod it chose (``FailPod``, reason ``Evicted``), republished
until the pod's ``desired`` entry says failed (the bus may drop a message)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from podvisor.common.logs import Log
from podvisor.ipc.bus import Publisher
from podvisor.ipc.clone import MapOwner
from podvisor.ipc.maps import PRESSURE_KEY, DesiredPod, NodePressure, PlegPod
from podvisor.ipc.messages import FailPod
from podvisor.services.eviction.manager import EvictionManager
from podvisor.services.eviction.rank import Eviction, PodUsage
from podvisor.services.eviction.signals import Observations

REASON = "Evicted"
RESEND = 0.5  # a FailPod not yet taken is published again this often


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
                 publisher: Publisher, log: Log, period: float) -> None:
        self.manager, self.inputs, self.pressure = manager, inputs, pressure
        self.publisher, self.log, self.period = publisher, log, period
        self.next_pass = 0.0
        self.asked: dict[str, Eviction] = {}  # evictions the sync loop has not taken yet
        self.conditions: tuple[str, ...] | None = None

    def step(self, now: float) -> float:
        desired = self.inputs.desired()
        self._follow(desired)
        if now >= self.next_pass:
            self.next_pass = now + self.period
            self._pass(now, desired)
        for e in self.asked.values():
            self.publisher.publish(FailPod(uid=e.uid, reason=REASON, message=e.message,
                                           grace=e.grace, event_type="Warning"))
        return min(self.next_pass, now + RESEND) if self.asked else self.next_pass

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
        for e in decision.evictions:
            self.log.warning("eviction.pod.evicted", pod=e.name, pod_uid=e.uid, why=e.why,
                             message=e.message, grace=e.grace)
            self.asked[e.uid] = e
