"""What a ``bus`` fault does to one process's bus traffic (issue 28): drop, delay or duplicate
the messages it sends or receives, on every topic or the prefixes a fault names.

One ``BusGate`` per process (its ``ServiceLoop`` builds it and sets its rules from the faults
aimed at that process, ``common/faultwatch.py``); the process's ``Publisher``s and
``Subscriber``s (the map replicas' included) consult it for each message. A delayed message is
held, in order, until it is due: outgoing frames by the gate (``release(now)`` sends them, the
loop calls it every turn and wakes for ``next_due()``), incoming envelopes by their subscriber
(``recv`` returns them once due). A duplicated message goes out (or is received) twice with the
same sequence number, which every receiver must take calmly (a replica ignores a sequence it
has; a hint is idempotent). Dropped, delayed and duplicated messages are counted by direction
(``counts``). The snapshot sockets of the replicated maps are not the bus: a replica that asks
for a snapshot still gets one.

Thread-safety: like the sockets it guards, the gate belongs to the loop's thread.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from podvisor.ipc.clock import Clock
from podvisor.ipc.faults import FaultSpec

__all__ = ["BusGate", "Verdict"]


@dataclass(frozen=True)
class Verdict:
    """What happens to one message: ``copies`` (0: dropped, 2: duplicated), each ``delay``
    seconds late."""

    copies: int = 1
    delay: float = 0.0


PASS = Verdict()


class BusGate:
    def __init__(self, clock: Clock, rand: Callable[[], float] = random.random) -> None:
        self._clock = clock
        self._rand = rand
        self._rules: tuple[FaultSpec, ...] = ()
        self._held: deque[tuple[float, Callable[[], object]]] = deque()
        self._recv_due: dict[int, float] = {}  # id(subscriber) -> its earliest held message
        self.counts: Counter[str] = Counter()  # "send.drop", "recv.delay", ...

    @property
    def active(self) -> bool:
        return bool(self._rules)

    def set_rules(self, rules: Sequence[FaultSpec]) -> None:
        """The bus faults aimed at this process now (others are ignored). Messages held by a
        delay that is lifted still go out when due: order is kept."""
        self._rules = tuple(r for r in rules if r.kind == "bus")

    def verdict(self, direction: str, topic: str) -> Verdict:
        """What the rules say of one message going ``direction`` ("send" or "recv")."""
        if not self._rules:
            return PASS
        copies, delay = 1, 0.0
        for rule in self._rules:
            if rule.direction not in (direction, "both"):
                continue
            if rule.topics and not topic.startswith(rule.topics):
                continue
            if rule.rate < 1 and self._rand() >= rule.rate:
                continue
            self.counts[f"{direction}.{rule.action}"] += 1
            if rule.action == "drop":
                return Verdict(0)
            if rule.action == "duplicate":
                copies = 2
            elif rule.action == "delay":
                delay = max(delay, rule.delay)
        return Verdict(copies, delay)

    # --- outgoing frames held by a delay -------------------------------------------------

    def hold(self, delay: float, send: Callable[[], object]) -> None:
        """Call ``send`` once ``delay`` seconds have passed (after whatever is held before)."""
        due = self._clock.monotonic() + delay
        if self._held:
            due = max(due, self._held[-1][0])
        self._held.append((due, send))

    def release(self, now: float) -> int:
        """Send the held frames that are due; how many went."""
        sent = 0
        while self._held and self._held[0][0] <= now:
            _, send = self._held.popleft()
            send()
            sent += 1
        return sent

    # --- incoming envelopes held by their subscribers ------------------------------------

    def recv_due(self, key: int, due: float | None) -> None:
        """A subscriber's earliest held envelope (None: it holds none)."""
        if due is None:
            self._recv_due.pop(key, None)
        else:
            self._recv_due[key] = due

    def next_due(self) -> float | None:
        """When the loop must turn for a held message (sent or received), if any is held."""
        dues = list(self._recv_due.values())
        if self._held:
            dues.append(self._held[0][0])
        return min(dues, default=None)
