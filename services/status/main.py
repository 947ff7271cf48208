"""The status process: replicate ``desired`` and ``pleg``, own and persist ``statuses``.

Loop: poll both replicas and the ``statuses`` snapshot socket; when a replica changed (or every
``SWEEP_PERIOD`` seconds, the kubelet's status sweep) recompute, publish the changes, and write
``state/statuses.json`` at most every ``SAVE_DEBOUNCE`` seconds while something is dirty.
At start the persisted statuses are published at once, before any recompute, so readers see the
last known statuses during a restart.

Clocks: monotonic for the loop; wall time only for the timestamps written into statuses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import zmq

from podvisor.ipc.bus import Publisher
from podvisor.ipc.clone import MapOwner, MapReplica
from podvisor.services.status.engine import Changes, StatusEngine
from podvisor.services.status.store import StatusStore
from podvisor.supervisor.child import ChildContext

MAP_NAME = "statuses"
SWEEP_PERIOD = 10.0
SAVE_DEBOUNCE = 0.2
POLL_MAX = 0.5
SNAPSHOT_TIMEOUT = 0.5  # a missing owner stalls one loop turn at most this long per replica

Clock = Callable[[], float]


def runtime_name(runtime_endpoint: str) -> str:
    """The containerID scheme: ``embedded://`` or e.g. ``containerd://``."""
    if runtime_endpoint == "embedded":
        return "embedded"
    return "containerd" if "containerd" in runtime_endpoint else "cri"


def store_path(ctx: ChildContext) -> Any:
    return ctx.paths.state_dir / "statuses.json"


class StatusService:
    def __init__(self, ctx: ChildContext, clock: Clock = time.monotonic,
                 wall: Clock = time.time) -> None:
        self.ctx = ctx
        self._clock = clock
        self._wall = wall
        self.store = StatusStore(store_path(ctx), ctx.log)
        self.engine = StatusEngine(self.store.load(), runtime_name(ctx.config.runtime_endpoint),
                                   ctx.config.address or "127.0.0.1")
        self.pub = Publisher(ctx.zctx, ctx.paths, ctx.name)
        self.owner = MapOwner(ctx.zctx, ctx.paths, self.pub, MAP_NAME)
        for uid, status in self.engine.statuses.items():
            self.owner.set(uid, status)
        self._dirty = False
        self._changed = True
        self.desired = MapReplica(ctx.zctx, ctx.paths, "desired", self._on_change,
                                  snapshot_timeout=SNAPSHOT_TIMEOUT)
        self.pleg = MapReplica(ctx.zctx, ctx.paths, "pleg", self._on_change,
                               snapshot_timeout=SNAPSHOT_TIMEOUT)
        self._last_save = 0.0
        self._last_sweep = clock()

    def _on_change(self, key: str, old: Any, new: Any) -> None:
        self._changed = True

    def step(self) -> Changes | None:
        """Recompute when something changed or the sweep is due; publish; save if due."""
        now = self._clock()
        result = None
        due = self._changed or now - self._last_sweep >= SWEEP_PERIOD
        if due and self.desired.synced and self.pleg.synced:
            result = self.engine.reconcile(self.desired.items(), self.pleg.items(), self._wall())
            if result is not None:
                self._changed = False
                self._last_sweep = now
                self._publish(result)
        if self._dirty and now - self._last_save >= SAVE_DEBOUNCE:
            self.save()
        return result

    def _publish(self, changes: Changes) -> None:
        for uid, status in changes.set.items():
            self.owner.set(uid, status)
        for uid in changes.deleted:
            self.owner.delete(uid)
        if changes:
            self._dirty = True

    def save(self) -> None:
        try:
            self.store.save(self.engine.saved())
            self._dirty = False
        except OSError as err:
            self.ctx.log.error("status.save_failed", path=str(self.store.path), error=str(err))
        self._last_save = self._clock()

    def run(self) -> None:
        poller = zmq.Poller()
        for sock in (self.owner.socket, self.desired.socket, self.pleg.socket):
            poller.register(sock, zmq.POLLIN)
        while not self.ctx.stop.is_set():
            self.ctx.heartbeat()
            ready = dict(poller.poll(int(POLL_MAX * 1000)))
            if self.owner.socket in ready:
                self.owner.serve()
            for replica in (self.desired, self.pleg):
                if replica.socket in ready or not replica.synced:
                    replica.pump(0)
            self.step()
            self.owner.tick(self._clock())

    def close(self) -> None:
        if self._dirty:
            self.save()
        for closable in (self.desired, self.pleg, self.owner, self.pub):
            closable.close()


def run(ctx: ChildContext) -> None:
    service = StatusService(ctx)
    try:
        service.run()
    finally:
        service.close()
