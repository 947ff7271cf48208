"""The pods' maps for the ops port and the event listeners, on the process's service loop.

``MapPump`` declares replicas of ``desired``, ``statuses`` and ``pleg`` and a subscriber of the
supervisor's ``supervisor.process.state`` messages on a ``ServiceLoop``; after each poll
(``drain``) that moved a map or saw a process change state it builds a new immutable
``PodMaps`` and hands it to ``publish(maps, changed)``, with ``changed`` true (and ``version``
+ 1) unless only entries under ``_`` keys moved (PLEG's ``_health`` moves at every relist):
readers that only care about pods and processes wake on real changes. ``pods_version`` moves
only with the pods' entries (not with a process state message), ``procs_version`` only with
process state messages: what is computed from the pods alone can be kept while only the
subsystems move, and a subsystem's change can be shown without waiting for the pods'. In the
ops process ``publish`` is the web service's (XML-RPC threads and the aiohttp loop read
``web.view``); in an event listener it feeds the listener. ``pods`` (shared by every
``PodMaps``): the typed pod of each ``desired`` entry, rebuilt once per change of a pod.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from podvisor.common.service import ServiceLoop
from podvisor.ipc.clone import MapReplica
from podvisor.ipc.maps import (
    DESIRED,
    PLEG,
    PRESSURE,
    PRESSURE_KEY,
    STATUSES,
    DesiredValue,
    NodePressure,
    PlegValue,
    PodStatusValue,
)
from podvisor.ipc.messages import ProcessStateChanged
from podvisor.services.pod import WirePods

__all__ = ["MapPump", "PodMaps"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})
SNAPSHOT_TIMEOUT = 0.5


@dataclass(frozen=True)
class PodMaps:
    desired: Mapping[str, DesiredValue] = field(default_factory=lambda: _EMPTY)
    statuses: Mapping[str, PodStatusValue] = field(default_factory=lambda: _EMPTY)
    pleg: Mapping[str, PlegValue] = field(default_factory=lambda: _EMPTY)
    synced: bool = False
    version: int = 0  # + 1 on a pod entry's change or a process state message
    pods_version: int = 0  # + 1 on a pod entry's change (or ``synced``) only
    procs_version: int = 0  # + 1 on a drain that received process state messages
    pods: WirePods = field(default_factory=WirePods)  # typed pods of ``desired`` (shared)
    pressure: NodePressure | None = None  # the eviction manager's conditions (not in synced)


class MapPump:
    def __init__(self, loop: ServiceLoop,
                 publish: Callable[[PodMaps, bool], object] | None = None) -> None:
        self._publish = publish
        self.maps = PodMaps()
        self.desired = loop.replica(DESIRED, snapshot_timeout=SNAPSHOT_TIMEOUT)
        self.statuses = loop.replica(STATUSES, snapshot_timeout=SNAPSHOT_TIMEOUT)
        self.pleg = loop.replica(PLEG, snapshot_timeout=SNAPSHOT_TIMEOUT)
        self.replicas: dict[str, MapReplica[Any]] = {
            r.map_name: r for r in (self.desired, self.statuses, self.pleg)}
        # the node's pressure: not one of ``replicas`` (``synced`` waits for the pods' maps
        # only: the eviction process may be turned off)
        self.pressure = loop.replica(PRESSURE, snapshot_timeout=SNAPSHOT_TIMEOUT)
        self.states = loop.subscriber([ProcessStateChanged.TOPIC])
        self._keys: dict[str, tuple[Any, ...]] = {}
        self._fingerprint: tuple[Any, ...] = ()

    def drain(self, now: float) -> None:
        """After a poll (the loop pumped the replicas): a new ``PodMaps`` if something moved."""
        replicas = self.replicas
        moved = False
        while self.states.recv(0) is not None:
            moved = True
        fresh = {n: (r.epoch, r.seq, r.synced) for n, r in replicas.items()}
        fresh[PRESSURE.name] = (self.pressure.epoch, self.pressure.seq, self.pressure.synced)
        if fresh == self._keys and not moved:
            return
        old, self._keys = self.maps, fresh
        d = MappingProxyType(self.desired.items())
        s = MappingProxyType(self.statuses.items())
        p = MappingProxyType(self.pleg.items())
        # values are replaced, never mutated, by a replica: ids tell what moved
        print_ = tuple((n, k, id(v)) for n, m in (("d", d), ("s", s), ("p", p))
                       for k, v in m.items() if not k.startswith("_"))
        synced = all(r.synced for r in replicas.values())
        pods = print_ != self._fingerprint or synced != old.synced
        bump = moved or pods
        self._fingerprint = print_
        old.pods.retain(d.keys())
        self.maps = PodMaps(d, s, p, synced=synced, version=old.version + (1 if bump else 0),
                            pods_version=old.pods_version + (1 if pods else 0),
                            procs_version=old.procs_version + (1 if moved else 0),
                            pods=old.pods, pressure=self.pressure.get(PRESSURE_KEY))
        if self._publish is not None:
            self._publish(self.maps, bump)
