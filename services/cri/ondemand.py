"""A runtime client connected only while it is used, for a process that calls the runtime once
in a while (the image GC: a container pass a minute, an image pass every five).

While any gRPC channel is open, grpcio's event-engine threads wake several times a second
(four workers, a timer thread and a lifeguard: ~0.1 % of a core per process, read from each
thread's schedstat in an idle 110-pod agent, whatever the channel does). Closing the last
channel ends them. ``OnDemandRuntimeClient`` makes the client at the first call and closes it on
``release()``, which the owner calls when a burst of calls is over; the next call connects again
(a unix socket: about a millisecond). Not for streams kept across a release. One thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from podvisor.services.cri.client import RuntimeClient


class OnDemandRuntimeClient:
    """Every ``RuntimeClient`` method, on a client made by ``connect()`` at first use."""

    def __init__(self, connect: Callable[[], RuntimeClient]) -> None:
        self._connect = connect
        self._client: RuntimeClient | None = None

    @property
    def connected(self) -> bool:
        return self._client is not None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not a client method (copy, pickle, a missing field)
            raise AttributeError(name)
        if self._client is None:
            self._client = self._connect()
        return getattr(self._client, name)

    def release(self) -> None:
        """Close the client (and its channel) until the next call."""
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def close(self) -> None:
        self.release()
