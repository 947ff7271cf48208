"""The bus's own counters, exported by every process on the service loop.

``podvisor_bus_messages_total``: bus messages this process's subscribers (its replicas'
included) received and decoded. ``podvisor_bus_dropped_total{reason}``: bus messages lost on
the way, by reason: the codec's (``oversize``, ``frames``, ``malformed``, ``unknown_type``,
``version``, ``fields``: a frame a subscriber received and refused), a replicated map's value
that no declared type reads (``MapReplica.value_drops``: ``fields``/``version`` as the codec's)
and ``hwm`` (a publisher's send queue was full: ZeroMQ's high-water mark; the message was never
sent).

The ipc layer only counts (plain ints and ``collections.Counter``s on ``Publisher``,
``Subscriber`` and ``MapReplica``: it imports no prometheus); ``BusTally`` turns those counts
into prometheus-client counters: ``flush()`` adds what grew since the last flush. The service
loop owns one tally, fed with every publisher, subscriber and replica it declares, and flushes
it at most once a second and when it closes. The counters are one pair per process (created
on first use), so several loops in one process never write the same multiprocess entry twice.
In the agent prometheus-client's multiprocess mode is on (``PROMETHEUS_MULTIPROC_DIR``, set by
the supervisor), so the values land in ``<rootDir>/run/metrics`` and the main port's
``/metrics`` sums them over every process, dead ones included: a restarted process adds on to
what its predecessor counted, and the totals never go back.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter

from podvisor.ipc.codec import REASONS

__all__ = ["FLUSH_EVERY", "HWM_REASON", "BusCounters", "BusTally", "bus_counters",
           "new_bus_counters"]

FLUSH_EVERY = 1.0  # seconds between two flushes of a service loop's tally
HWM_REASON = "hwm"


class _Receiving(Protocol):
    """A ``Subscriber`` (or a ``MapReplica``, whose subscriber it reports)."""

    @property
    def received(self) -> int: ...

    @property
    def drops(self) -> Mapping[str, int]: ...


class _Publishing(Protocol):
    @property
    def dropped(self) -> int: ...


class _Decoding(Protocol):
    @property
    def value_drops(self) -> Mapping[str, int]: ...


@dataclass(frozen=True)
class BusCounters:
    registry: CollectorRegistry
    messages: Counter
    dropped: Counter


_lock = threading.Lock()
_process: BusCounters | None = None


def new_bus_counters() -> BusCounters:
    """A fresh pair on a private registry (tests; ``bus_counters()`` in a process)."""
    registry = CollectorRegistry(auto_describe=False)
    messages = Counter("podvisor_bus_messages", "Bus messages received and decoded by the "
                       "process's subscribers", registry=registry)
    dropped = Counter("podvisor_bus_dropped", "Bus messages dropped, by reason (codec "
                      "refusals, undeclared map values, hwm: a full send queue)", ["reason"],
                      registry=registry)
    for reason in (*REASONS, HWM_REASON):  # every reason shows, at 0 until it happens
        dropped.labels(reason)
    return BusCounters(registry, messages, dropped)


def bus_counters() -> BusCounters:
    """The process's one pair of bus counters."""
    global _process
    with _lock:
        if _process is None:
            _process = new_bus_counters()
        return _process


class BusTally:
    """What a set of bus endpoints counted, added to the process's counters on ``flush()``
    (only the growth since the previous flush). One thread (the service loop's)."""

    def __init__(self, counters: BusCounters | None = None) -> None:
        self._counters = counters if counters is not None else bus_counters()
        self._receiving: list[_Receiving] = []
        self._publishing: list[_Publishing] = []
        self._decoding: list[_Decoding] = []
        self._last: dict[tuple[int, str], int] = {}

    def receiving(self, source: _Receiving) -> None:
        self._receiving.append(source)

    def publishing(self, source: _Publishing) -> None:
        self._publishing.append(source)

    def decoding(self, source: _Decoding) -> None:
        self._decoding.append(source)

    def _grown(self, source: object, key: str, value: int) -> int:
        slot = (id(source), key)
        before = self._last.get(slot, 0)
        self._last[slot] = value
        return max(0, value - before)

    def flush(self) -> None:
        messages = 0
        drops: dict[str, int] = {}
        for r in self._receiving:
            messages += self._grown(r, "", r.received)
            for reason, n in list(r.drops.items()):
                drops[reason] = drops.get(reason, 0) + self._grown(r, reason, n)
        for d in self._decoding:
            for reason, n in list(d.value_drops.items()):
                drops[reason] = drops.get(reason, 0) + self._grown(d, "value:" + reason, n)
        for p in self._publishing:
            drops[HWM_REASON] = drops.get(HWM_REASON, 0) + self._grown(p, "", p.dropped)
        if messages:
            self._counters.messages.inc(messages)
        for reason, n in drops.items():
            if n:
                self._counters.dropped.labels(reason).inc(n)
