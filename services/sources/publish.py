"""How a source process hands its full set to the rest of the agent.

Every read sets the single key ``set`` of the replicated map ``pods-<source>``
(``ipc/maps.py``: a ``PodSetValue``), so a sync loop that starts or restarts fetches the current
set from a snapshot at once instead of waiting for the next relist (``fileCheckFrequency``,
20 s by default). That map is the one path for pod sets.
"""

from __future__ import annotations

from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop
from podvisor.ipc.maps import POD_SET_KEY, pods_map
from podvisor.services.sources.common import SourceSet


class SetPublisher:
    """The source's map, declared in the process's service loop (which answers snapshot
    requests and sends the map's idle heartbeats). Main thread only."""

    def __init__(self, ctx: ChildContext, source: str, loop: ServiceLoop) -> None:
        self._clock = ctx.clock
        self._owner = loop.owner(loop.publisher(), pods_map(source))

    def publish(self, result: SourceSet) -> None:
        self._owner.set(POD_SET_KEY, result.to_value(self._clock.monotonic()))
