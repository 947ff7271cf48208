"""The pods' maps for the ops port, pumped on one thread (zmq sockets are thread-bound).

``MapPump`` owns replicas of ``desired``, ``statuses`` and ``pleg``; after each drain it
publishes a new immutable ``PodMaps`` by swapping one attribute (atomic under the GIL), and
calls ``on_change`` (from its thread) so the dashboard can push. Readers (XML-RPC threads, the
aiohttp loop) only read ``pump.maps``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import zmq

from podvisor.ipc.clone import MapReplica
from podvisor.ipc.paths import RunPaths
from podvisor.supervisor.child import StopEvent

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
    def __init__(self, zctx: zmq.Context[zmq.Socket[bytes]], paths: RunPaths,
                 on_change: Callable[[], None] | None = None) -> None:
        self._zctx, self._paths, self._on_change = zctx, paths, on_change
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
        replicas = {n: MapReplica(self._zctx, self._paths, n, snapshot_timeout=SNAPSHOT_TIMEOUT)
                    for n in names}
        poller = zmq.Poller()
        for sock in [s for r in replicas.values() for s in r.sockets]:
            poller.register(sock, zmq.POLLIN)
        poller.register(self.stop.fileno(), zmq.POLLIN)
        keys: dict[str, tuple[Any, ...]] = {}
        try:
            while not self.stop.is_set():
                synced = all(r.synced for r in replicas.values())
                ready = dict(poller.poll(None if synced else int(SNAPSHOT_TIMEOUT * 1000)))
                for replica in replicas.values():
                    if any(s in ready for s in replica.sockets) or not replica.synced:
                        replica.pump(0)
                fresh = {n: (r.epoch, r.seq, r.synced) for n, r in replicas.items()}
                if fresh == keys:
                    continue
                old, keys = self.maps, fresh
                d, s, p = (MappingProxyType(replicas[n].items()) for n in names)
                self.maps = PodMaps(d, s, p, synced=all(r.synced for r in replicas.values()),
                                    version=old.version + 1)
                if self._on_change is not None:
                    self._on_change()
        finally:
            for replica in replicas.values():
                replica.close()

    def close(self, timeout: float = 2.0) -> None:
        self.stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
