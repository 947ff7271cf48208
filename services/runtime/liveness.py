"""Whether the runtime's gRPC server answers: the runtime process heartbeats only while it does.

The process's main thread is free whatever its gRPC server does, so a beat from it alone says
nothing about the server: a server whose handler pool is wedged (every thread blocked in a call
that never returns) would be heartbeated for ever, and never restarted. So the service loop asks
the server ``Version`` over its own socket, the way a client does, and beats only while the last
answer is fresh. Each call opens its own channel (an idle open channel keeps gRPC's pollers
waking); at one call every five heartbeat intervals the probe and the service loop cost the idle
runtime ~0.04 % of a core (measured: 0.05-0.07 % before, 0.10 % with them).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import grpc
from cri_api.v1 import api_pb2 as pb
from cri_api.v1 import api_pb2_grpc as pb_grpc

from podvisor.ipc.clock import Clock

# marks the probe's own calls: an injected cri latency or error leaves them alone (a hang does
# not: a hung server must be found out), faultgate.py
PROBE_METADATA = ("podvisor-probe", "1")


class ServerProbe:
    """``poke(now)`` asks ``Version`` once ``every`` seconds (waiting ``deadline`` at most);
    ``answering(now)`` holds while the last answer came at most ``fresh`` seconds ago. One
    thread (the loop's)."""

    def __init__(self, socket_path: Path, clock: Clock, *, every: float, fresh: float,
                 deadline: float) -> None:
        self._target = f"unix://{socket_path}"
        self._clock = clock
        self._every = every
        self._fresh = fresh
        self._deadline = deadline
        self._next = -math.inf
        self.answered = -math.inf  # when the server last answered (monotonic)

    def poke(self, now: float) -> float:
        """Ask when due; returns when the next is due."""
        if now >= self._next:
            self._next = now + self._every
            if self._ask():
                self.answered = self._clock.monotonic()
        return self._next

    def _ask(self) -> bool:
        # a channel per call: an idle open channel costs its polling threads' wake-ups
        with grpc.insecure_channel(self._target) as channel:
            stubs: Any = pb_grpc
            try:
                stubs.RuntimeServiceStub(channel).Version(pb.VersionRequest(),
                                                          timeout=self._deadline,
                                                          metadata=(PROBE_METADATA,))
            except grpc.RpcError:
                return False
        return True

    def answering(self, now: float) -> bool:
        return now - self.answered <= self._fresh
