"""How a source process hands its full set to the rest of the agent.

Every read is published twice over: as a ``PodSet`` message (for anyone listening) and as the
single key ``set`` of the replicated map ``pods-<source>`` (ipc/clone.py), so a sync loop that
starts or restarts fetches the current set from a snapshot at once instead of waiting for the
next relist (``fileCheckFrequency``, 20 s by default).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import zmq

from podvisor.ipc.bus import Publisher
from podvisor.ipc.clone import MapOwner
from podvisor.services.sources.common import SourceSet
from podvisor.supervisor.child import ChildContext

SET_KEY = "set"


def map_name(source: str) -> str:
    """The replicated map that carries ``source``'s set (``file`` -> ``pods-file``)."""
    return f"pods-{source}"


class SetPublisher:
    """Owns the source's publisher and map. Main thread only; call ``service()`` at least every
    few hundred milliseconds from the loop (it answers snapshot requests)."""

    def __init__(self, ctx: ChildContext, source: str) -> None:
        self._publisher = Publisher(ctx.zctx, ctx.paths, source=ctx.name)
        self._owner = MapOwner(ctx.zctx, ctx.paths, self._publisher, map_name(source),
                               heartbeat_interval=ctx.config.supervision.heartbeat_interval)

    def publish(self, result: SourceSet) -> None:
        msg = result.to_message(time.monotonic())
        self._publisher.publish(msg)
        self._owner.set(SET_KEY, {"pods": msg.pods, "errors": msg.errors})

    def set_value(self, key: str, value: object) -> None:
        """Another key of the source's map (the API source's ``mirrors``)."""
        self._owner.set(key, value)

    @property
    def socket(self) -> zmq.Socket[bytes]:
        """The map's snapshot ROUTER: poll it and call ``service()`` when readable."""
        return self._owner.socket

    def next_tick(self) -> float:
        """When ``service()`` must run next for the map's idle heartbeat (monotonic)."""
        return self._owner.next_tick()

    def wait(self, ctx: ChildContext, extra: Sequence[Any] = (), until: float = math.inf,
             ) -> None:
        """Block until the snapshot socket, one of ``extra`` (zmq sockets or fds) or the stop fd
        is readable, or the next deadline: ``until``, the map heartbeat, the process
        heartbeat. No fixed short poll: an idle source wakes about once a second."""
        poller = zmq.Poller()
        for item in (self._owner.socket, *extra):
            poller.register(item, zmq.POLLIN)
        if ctx.stop_fd is not None:
            poller.register(ctx.stop_fd, zmq.POLLIN)
        now = time.monotonic()
        deadline = min(until, self.next_tick(), now + ctx.heartbeat_interval)
        poller.poll(math.ceil(max(0.0, deadline - now) * 1000))

    def service(self) -> None:
        self._owner.serve()
        self._owner.tick(time.monotonic())

    def close(self) -> None:
        self._owner.close()
        self._publisher.close()
