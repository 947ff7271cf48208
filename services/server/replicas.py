"""The HTTP server's replicas, on the process's service loop (``common.web.WebService``).

``ServerReplicas`` declares the ``desired``, ``statuses`` and ``pleg`` replicas on the loop;
traffic on the ``desired`` replica's subscriber (the owner's updates and idle heartbeats) tells
when the sync loop was last heard. After every poll that pumped what was queued (``drain``), it
publishes a new immutable ``View`` when something moved; aiohttp handlers read the web
service's ``view`` and never touch zmq. A map is copied into the view only when it moved.

Lazy: the view is what HTTP clients read, so the loop does not drain on every update. Traffic
waits (queued in zmq) until ``BATCH`` after the previous drain, unless a handler asks for a
fresh view (``await web.refresh()``: the loop drains at once and hands back the view). 200
pods starting send ~1000 updates in 2 s: drained per request (a poller every 0.1 s) or per
``BATCH``, not one wake-up, drain and view per update. While a replica waits for its snapshot
the loop drains at once. The sync loop's "heard" time is that of the drain that found its
traffic (at most ``BATCH`` late; the health threshold is 30 s).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from podvisor.common.service import ServiceLoop
from podvisor.ipc.clone import MapReplica
from podvisor.ipc.maps import DESIRED, PLEG, STATUSES, DesiredValue, PlegValue, PodStatusValue

SNAPSHOT_TIMEOUT = 0.5
BATCH = 0.5  # traffic waits at most this long for a drain when no handler asks for one
_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class View:
    """What the handlers see. Never mutated after publication."""

    desired: Mapping[str, DesiredValue] = field(default_factory=lambda: _EMPTY)
    statuses: Mapping[str, PodStatusValue] = field(default_factory=lambda: _EMPTY)
    pleg: Mapping[str, PlegValue] = field(default_factory=lambda: _EMPTY)
    desired_synced: bool = False
    statuses_synced: bool = False
    pleg_synced: bool = False
    desired_heard: float | None = None  # monotonic time the desired owner was last heard


class ServerReplicas:
    """The server's three replicas on ``loop``; ``drain`` hands a new ``View`` to ``publish``
    when one moved."""

    def __init__(self, loop: ServiceLoop, publish: Callable[[View], object]) -> None:
        self.loop = loop
        self.desired = loop.replica(DESIRED, snapshot_timeout=SNAPSHOT_TIMEOUT)
        self.statuses = loop.replica(STATUSES, snapshot_timeout=SNAPSHOT_TIMEOUT)
        self.pleg = loop.replica(PLEG, snapshot_timeout=SNAPSHOT_TIMEOUT)
        self.maps: dict[str, MapReplica[Any]] = {
            r.map_name: r for r in (self.desired, self.statuses, self.pleg)}
        self._owner = self.desired.socket  # the desired owner's updates and heartbeats
        self._publish = publish
        self.view = View()
        self.drains = 0
        self._keys: dict[str, tuple[Any, ...]] = {}
        self._heard: float | None = None

    def drain(self, now: float) -> None:
        """After a poll that pumped whatever was queued: publish a new view if it moved."""
        self.drains += 1
        if self._owner in self.loop.ready:
            self._heard = self.loop.last_pump
        heard = self._heard
        keys = {name: (r.epoch, r.seq, r.synced) for name, r in self.maps.items()}
        if keys == self._keys and self.view.desired_heard == heard:
            return  # nothing moved: keep the current view
        old = self.view
        moved = {name for name in keys if keys[name] != self._keys.get(name)}
        self._keys = keys
        d, s, p = self.desired, self.statuses, self.pleg
        self.view = View(
            MappingProxyType(d.items()) if d.map_name in moved else old.desired,
            MappingProxyType(s.items()) if s.map_name in moved else old.statuses,
            MappingProxyType(p.items()) if p.map_name in moved else old.pleg,
            d.synced, s.synced, p.synced, heard)
        self._publish(self.view)
