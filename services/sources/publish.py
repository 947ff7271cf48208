"""How a source process hands its full set to the rest of the agent.

Every read is published twice over: as a ``PodSet`` message (for anyone listening) and as the
single key ``set`` of the replicated map ``pods-<source>`` (ipc/clone.py), so a sync loop that
starts or restarts fetches the current set from a snapshot at once instead of waiting for the
next relist (``fileCheckFrequency``, 20 s by default).
"""

from __future__ import annotations

import time

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

    def service(self) -> None:
        self._owner.serve()
        self._owner.tick(time.monotonic())

    def close(self) -> None:
        self._owner.close()
        self._publisher.close()
