"""The dashboard's live feed, its decisions as data (pure: no I/O, no clock of its own).

The broadcaster (``dashboard.Dashboard.broadcast``) serves every open page from one loop:

- it computes the page's state when the map pump says something moved (a pod, status or runtime
  record changed, or a subsystem changed state: the ``supervisor.process.state`` messages the
  ops process already receives), at most once per ``min_gap`` (a burst coalesces: the pods'
  part costs tens of ms at 110 pods), and sends it only when its content (``Snapshot.key``:
  everything but the passing of time) changed; a subsystem that changed state inside that gap
  is shown at once (``AGENTS``: its rows asked again, the pods' part as last computed; the full
  state follows at the gap's end);
- with nothing moving it sends a ``ping`` every ``keepalive`` (the page's clock and its dead
  connection watchdog) and, every ``recheck``, asks the supervisor again (a dropped bus message
  is a missed hint; a state that did not change is not sent);
- otherwise it sleeps until the next of those or a change wakes it: no poll.

``FeedPlan.next(now, moved)`` says which; ``frame(event, data)`` encodes one server-sent event
once, and the same bytes go to every subscriber. ``agent_key`` is what of the subsystems' rows
counts as content (not ``start``: the supervisor gives an uptime, so ``now - uptime`` jitters).
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from podvisor.services.ops.procs import Proc

__all__ = ["FEED_TIMES", "Action", "FeedPlan", "FeedTimes", "Snapshot", "Step", "agent_key",
           "frame", "ping_frame"]

MIN_GAP = 0.1  # at most one computed state per this (a burst of changes coalesces)
KEEPALIVE = 15.0  # a ping when nothing was sent for this long
RECHECK = 60.0  # ask the supervisor again with nothing moving (bus messages are hints)
RETRY_MS = 1000  # the page's EventSource reconnects this soon after a dropped connection


class Action(enum.Enum):
    COMPUTE = "compute"  # compute the state; send it if its key changed
    AGENTS = "agents"  # the subsystems' rows now, the pods' part as last computed
    PING = "ping"  # send a keep-alive with the server's clock
    WAIT = "wait"  # sleep until ``Step.at`` or a change


@dataclass(frozen=True)
class Step:
    action: Action
    at: float = math.inf  # WAIT: when to look again with nothing moving


@dataclass(frozen=True)
class FeedTimes:
    min_gap: float = MIN_GAP
    keepalive: float = KEEPALIVE
    recheck: float = RECHECK


FEED_TIMES = FeedTimes()


class FeedPlan:
    """When the broadcaster computes, pings or waits (pure; ``now`` on the monotonic clock).

    ``computed(now)`` and ``sent(now)`` record what the broadcaster did; ``next(now, moved,
    agents_moved)`` (``moved``: the maps or a process state moved since the last computation;
    ``agents_moved``: a process state moved since the subsystems' rows were last asked) says
    what comes next. A fresh plan computes at once (a first client gets a state)."""

    def __init__(self, times: FeedTimes = FEED_TIMES) -> None:
        self.times = times
        self.last_compute = -math.inf
        self.last_send = -math.inf

    def computed(self, now: float) -> None:
        self.last_compute = now

    def sent(self, now: float) -> None:
        self.last_send = now

    def next(self, now: float, moved: bool, agents_moved: bool = False) -> Step:
        t = self.times
        if moved or agents_moved or now >= self.last_compute + t.recheck:
            gap_end = self.last_compute + t.min_gap
            if now >= gap_end:
                return Step(Action.COMPUTE)
            return Step(Action.AGENTS) if agents_moved else Step(Action.WAIT, gap_end)
        if now >= self.last_send + t.keepalive:
            return Step(Action.PING)
        return Step(Action.WAIT, min(self.last_compute + t.recheck,
                                     self.last_send + t.keepalive))


@dataclass(frozen=True)
class Snapshot:
    """A computed state: ``key`` (its content, time aside) and ``body`` (the JSON text)."""

    key: object  # compared with ==
    body: str


def agent_key(procs: Iterable[Proc]) -> tuple[Any, ...]:
    """What the page shows of the subsystems, time aside: a change of state, pid, restarts,
    last exit, reason or heartbeat lateness changes it; another ``now`` (and the ``start``
    derived from it) does not, nor the heartbeat's age (new at every ask; the page ticks a
    late one from the state that said it went late)."""
    return tuple((p.name, p.state, p.pid, p.restarts, p.stop, p.exitstatus, p.spawnerr,
                  {k: v for k, v in p.extra.items() if k != "heartbeatAge"}) for p in procs)


def frame(event: str, data: str) -> bytes:
    """One server-sent event (``data`` is one line: compact JSON)."""
    return b"event: " + event.encode() + b"\ndata: " + data.encode() + b"\n\n"


def ping_frame(now: float, keepalive: float) -> bytes:
    """The keep-alive: the server's wall clock in whole seconds and the ping period (the page
    reconnects when three go missing)."""
    return frame("ping", json.dumps({"now": int(now), "every": keepalive},
                                    separators=(",", ":")))
