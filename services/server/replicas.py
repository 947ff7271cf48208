"""Replicas for the HTTP server, pumped on one thread (zmq sockets are thread-bound).

``ReplicaPump`` owns the ``desired``, ``statuses`` and ``pleg`` replicas; traffic on the
``desired`` replica's subscriber (the owner's updates and idle heartbeats) tells when the sync
loop was last heard. After every change it publishes a new immutable ``View`` by swapping one
attribute (atomic under the GIL); aiohttp handlers read ``pump.view`` and never touch zmq. A map
is copied into the view only when it moved (200 pods starting move one map per update).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import zmq

from podvisor.ipc.clone import MapReplica
from podvisor.ipc.paths import RunPaths
from podvisor.supervisor.child import StopEvent

Clock = Callable[[], float]
SNAPSHOT_TIMEOUT = 0.5
_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class View:
    """What the handlers see. Never mutated after publication."""

    desired: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    statuses: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    pleg: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    desired_synced: bool = False
    statuses_synced: bool = False
    pleg_synced: bool = False
    desired_heard: float | None = None  # monotonic time the desired owner was last heard


class ReplicaPump:
    def __init__(self, zctx: zmq.Context[zmq.Socket[bytes]], paths: RunPaths,
                 clock: Clock = time.monotonic) -> None:
        self._zctx = zctx
        self._paths = paths
        self._clock = clock
        self.view = View()
        self.stop = StopEvent()  # pollable: close() wakes the pump thread at once
        self.error: BaseException | None = None
        self.pumps = 0
        self._keys: dict[str, tuple[Any, ...]] = {}
        self._heard: float | None = None
        self._thread = threading.Thread(target=self._run, name="replica-pump", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as err:  # reported to the main thread, which exits
            self.error = err

    def _loop(self) -> None:
        maps = {name: MapReplica(self._zctx, self._paths, name, snapshot_timeout=SNAPSHOT_TIMEOUT)
                for name in ("desired", "statuses", "pleg")}
        owner = maps["desired"].socket  # the desired owner's updates and idle heartbeats
        heard: float | None = None
        poller = zmq.Poller()  # for the thread's life: a replica keeps its sockets for life
        for sock in [s for r in maps.values() for s in r.sockets]:
            poller.register(sock, zmq.POLLIN)
        poller.register(self.stop.fileno(), zmq.POLLIN)
        try:
            while not self.stop.is_set():
                # block until traffic (every owner heartbeats each second); re-ask a snapshot
                # that is still missing every SNAPSHOT_TIMEOUT
                synced = all(r.synced for r in maps.values())
                ready = dict(poller.poll(None if synced else int(SNAPSHOT_TIMEOUT * 1000)))
                if owner in ready:
                    heard = self._clock()
                for replica in maps.values():
                    if any(s in ready for s in replica.sockets) or not replica.synced:
                        replica.pump(0)
                self._publish(maps, heard)
        finally:
            for replica in maps.values():
                replica.close()

    def _publish(self, maps: Mapping[str, MapReplica], heard: float | None) -> None:
        self.pumps += 1
        keys = {name: (r.epoch, r.seq, r.synced) for name, r in maps.items()}
        if keys == self._keys and heard == self._heard:
            return  # nothing moved: keep the current view
        old = self.view
        fresh = {name: MappingProxyType(maps[name].items()) for name in keys
                 if keys[name] != self._keys.get(name)}
        self._keys, self._heard = keys, heard
        d, s, p = maps["desired"], maps["statuses"], maps["pleg"]
        self.view = View(fresh.get("desired", old.desired), fresh.get("statuses", old.statuses),
                         fresh.get("pleg", old.pleg), d.synced, s.synced, p.synced, heard)

    def close(self, timeout: float = 2.0) -> None:
        self.stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
