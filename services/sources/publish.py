"""How a source process hands its full set to the rest of the agent.

Every read is published twice over: as a ``PodSet`` message (for anyone listening) and as the
single key ``set`` of the replicated map ``pods-<source>`` (ipc/clone.py), so a sync loop that
starts or restarts fetches the current set from a snapshot at once instead of waiting for the
next relist (``fileCheckFrequency``, 20 s by default).
"""

from __future__ import annotations

from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop
from podvisor.services.sources.common import SourceSet

SET_KEY = "set"


def map_name(source: str) -> str:
    """The replicated map that carries ``source``'s set (``file`` -> ``pods-file``)."""
    return f"pods-{source}"


class SetPublisher:
    """The source's publisher and map, declared in the process's service loop (which answers
    snapshot requests and sends the map's idle heartbeats). Main thread only."""

    def __init__(self, ctx: ChildContext, source: str, loop: ServiceLoop) -> None:
        self._clock = ctx.clock
        self._publisher = loop.publisher()
        self._owner = loop.owner(self._publisher, map_name(source))

    def publish(self, result: SourceSet) -> None:
        msg = result.to_message(self._clock.monotonic())
        self._publisher.publish(msg)
        self._owner.set(SET_KEY, {"pods": msg.pods, "errors": msg.errors})

    def service(self) -> None:
        """Answer pending snapshot requests and send a due idle heartbeat now (from inside a
        long step, e.g. while a fetch runs on its thread)."""
        self._owner.serve()
        self._owner.tick(self._clock.monotonic())
