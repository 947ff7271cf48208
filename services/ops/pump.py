"""The pods' maps for the ops port, pumped on one thread (zmq sockets are thread-bound).

``MapPump`` owns replicas of ``desired``, ``statuses`` and ``pleg`` and a subscriber of the
supervisor's ``supervisor.process.state`` messages; after each drain that moved a map or saw a
process change state it publishes a new immutable ``PodMaps`` (``version`` + 1) by swapping one
attribute (atomic under the GIL), and calls ``on_change`` (from its thread). Entries under
``_`` keys (PLEG's ``_health`` moves at every relist) do not bump the version: readers that
only care about pods and processes wake on real changes. Readers (XML-RPC threads, the aiohttp
loop) only read ``pump.maps``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import zmq

from podvisor.common.child import StopEvent
from podvisor.ipc.bus import Subscriber
from podvisor.ipc.clock import Clock
from podvisor.ipc.clone import MapReplica
from podvisor.ipc.messages import ProcessStateChanged
from podvisor.ipc.paths import RunPaths

__all__ = ["MapPump", "PodMaps"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})
SNAPSHOT_TIMEOUT = 0.5


@dataclass(frozen=True)
class PodMaps:
    desired: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    statuses: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    pleg: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    synced: bool = False
    version: int = 0


class MapPump:
    def __init__(self, zctx: zmq.Context[zmq.Socket[bytes]], paths: RunPaths, clock: Clock,
                 on_change: Callable[[], None] | None = None) -> None:
        self._zctx, self._paths, self._on_change = zctx, paths, on_change
        self._clock = clock
        self.maps = PodMaps()
        self.stop = StopEvent()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ops-maps", daemon=True)

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
        names = ("desired", "statuses", "pleg")
        replicas = {n: MapReplica(self._zctx, self._paths, n, snapshot_timeout=SNAPSHOT_TIMEOUT,
                               clock=self._clock)
                    for n in names}
        poller = zmq.Poller()
        for sock in [s for r in replicas.values() for s in r.sockets]:
            poller.register(sock, zmq.POLLIN)
        poller.register(self.stop.fileno(), zmq.POLLIN)
        states = Subscriber(self._zctx, self._paths, [ProcessStateChanged.TOPIC])
        poller.register(states.socket, zmq.POLLIN)
        keys: dict[str, tuple[Any, ...]] = {}
        fingerprint: tuple[Any, ...] = ()
        try:
            while not self.stop.is_set():
                synced = all(r.synced for r in replicas.values())
                ready = dict(poller.poll(None if synced else int(SNAPSHOT_TIMEOUT * 1000)))
                for replica in replicas.values():
                    if any(s in ready for s in replica.sockets) or not replica.synced:
                        replica.pump(0)
                moved = False
                while states.recv(0) is not None:
                    moved = True
                fresh = {n: (r.epoch, r.seq, r.synced) for n, r in replicas.items()}
                if fresh == keys and not moved:
                    continue
                old, keys = self.maps, fresh
                d, s, p = (MappingProxyType(replicas[n].items()) for n in names)
                # values are replaced, never mutated, by a replica: ids tell what moved
                print_ = tuple((n, k, id(v)) for n, m in zip(names, (d, s, p), strict=True)
                               for k, v in m.items() if not k.startswith("_"))
                synced = all(r.synced for r in replicas.values())
                bump = moved or print_ != fingerprint or synced != old.synced
                fingerprint = print_
                self.maps = PodMaps(d, s, p, synced=synced,
                                    version=old.version + (1 if bump else 0))
                if not bump:
                    continue
                if self._on_change is not None:
                    self._on_change()
        finally:
            states.close()
            for replica in replicas.values():
                replica.close()

    def close(self, timeout: float = 2.0) -> None:
        self.stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
