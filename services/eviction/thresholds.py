"""Thresholds, when they are met, and the node conditions they make (the kubelet's
``eviction/helpers.go``: ``parseThresholdConfig``, ``thresholdsMet``,
``thresholdsFirstObservedAt``, ``thresholdsMetGracePeriod``, ``nodeConditions``,
``nodeConditionsObservedSince``). Pure: observations and times come in as values.

A threshold is ``signal < value`` (a quantity, or a percentage of the signal's capacity), hard
(grace 0) or soft (acted on once met for its grace period). ``evictionMinimumReclaim``: a
threshold met on the last pass stays met until the signal is at least threshold + reclaim.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from podvisor.common.quantity import QuantityError, parse_quantity
from podvisor.services.eviction.signals import (
    ALLOC_MEMORY,
    IMAGEFS,
    IMAGEFS_INODES,
    MEMORY,
    NODEFS,
    NODEFS_INODES,
    PIDS,
    Observations,
)

MEMORY_PRESSURE, DISK_PRESSURE, PID_PRESSURE = "MemoryPressure", "DiskPressure", "PIDPressure"
CONDITION_OF = {MEMORY: MEMORY_PRESSURE, ALLOC_MEMORY: MEMORY_PRESSURE,
                NODEFS: DISK_PRESSURE, NODEFS_INODES: DISK_PRESSURE,
                IMAGEFS: DISK_PRESSURE, IMAGEFS_INODES: DISK_PRESSURE,
                "containerfs.available": DISK_PRESSURE,
                "containerfs.inodesFree": DISK_PRESSURE, PIDS: PID_PRESSURE}
# the resource a signal's eviction reclaims (the kubelet's signalToResource), as messages name it
RESOURCE_OF = {MEMORY: "memory", ALLOC_MEMORY: "memory", NODEFS: "ephemeral-storage",
               NODEFS_INODES: "inodes", IMAGEFS: "ephemeral-storage", IMAGEFS_INODES: "inodes",
               "containerfs.available": "ephemeral-storage",
               "containerfs.inodesFree": "inodes", PIDS: "pids"}
CONDITION_ORDER = (MEMORY_PRESSURE, DISK_PRESSURE, PID_PRESSURE)


@dataclass(frozen=True)
class Amount:
    """A quantity (``quantity``, in the signal's unit) or a ``percent`` of its capacity."""

    quantity: int | None = None
    percent: float | None = None
    text: str = ""  # as written (a quantity threshold's message shows it so)

    def of(self, capacity: int) -> int:
        if self.percent is not None:
            return int(capacity * self.percent / 100)  # GetThresholdQuantity
        return self.quantity or 0

    @classmethod
    def parse(cls, text: str) -> Amount:
        if text.endswith("%"):
            return cls(percent=float(text[:-1]))
        try:
            return cls(quantity=int(parse_quantity(text)), text=text)
        except QuantityError as exc:
            raise ValueError(str(exc)) from None


@dataclass(frozen=True)
class Threshold:
    signal: str
    value: Amount
    grace: float = 0.0  # 0: hard
    min_reclaim: Amount = Amount(quantity=0)
    hard: bool = True

    @property
    def condition(self) -> str:
        return CONDITION_OF.get(self.signal, "")

    @property
    def resource(self) -> str:
        return RESOURCE_OF.get(self.signal, self.signal)

    def describe(self) -> str:
        value = self.value.text if self.value.percent is None else f"{self.value.percent:g}%"
        return f"{self.signal}<{value}"

    def quantity_text(self, capacity: int) -> str:
        """The threshold's quantity as the kubelet's message shows it (a percentage: of
        ``capacity``, in binary units)."""
        if self.value.percent is None and self.value.text:
            return self.value.text
        return format_binary(self.value.of(capacity))


_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def format_binary(n: int) -> str:
    """A byte count as a Kubernetes BinarySI quantity prints it: the largest power of 1024
    that divides it exactly (``104857600`` -> ``100Mi``, ``1536`` -> ``1536``)."""
    if n == 0:
        return "0"
    exp = 0
    while exp < len(_SUFFIXES) - 1 and n % 1024 == 0:
        n //= 1024
        exp += 1
    return f"{n}{_SUFFIXES[exp]}"


def parse_thresholds(hard: Mapping[str, str], soft: Mapping[str, str] = {},
                     grace: Mapping[str, float] = {},
                     reclaim: Mapping[str, str] = {}) -> tuple[list[Threshold], list[str]]:
    """The thresholds of the config, and the problems (a soft threshold without a grace
    period is dropped, as the kubelet refuses it: ``evictionSoftGracePeriod`` must name it)."""
    problems: list[str] = []
    out: list[Threshold] = []
    for signal, value in hard.items():
        out.append(Threshold(signal, Amount.parse(value), 0.0,
                             Amount.parse(reclaim.get(signal, "0")), True))
    for signal, value in soft.items():
        if signal not in grace:
            problems.append(f"evictionSoft.{signal}: no evictionSoftGracePeriod for it")
            continue
        out.append(Threshold(signal, Amount.parse(value), grace[signal],
                             Amount.parse(reclaim.get(signal, "0")), False))
    return out, problems


def is_met(t: Threshold, obs: Observations, enforce_min_reclaim: bool) -> bool:
    o = obs.get(t.signal)
    if o is None:
        return False
    quantity = t.value.of(o.capacity)
    if enforce_min_reclaim:
        quantity += t.min_reclaim.of(o.capacity)
    return o.available < quantity


def thresholds_met(thresholds: Iterable[Threshold], obs: Observations,
                   enforce_min_reclaim: bool) -> list[Threshold]:
    return [t for t in thresholds if is_met(t, obs, enforce_min_reclaim)]


def merge(a: Sequence[Threshold], b: Sequence[Threshold]) -> list[Threshold]:
    return [*a, *(t for t in b if t not in a)]


def first_observed(met: Iterable[Threshold], before: Mapping[Threshold, float],
                   now: float) -> dict[Threshold, float]:
    return {t: before.get(t, now) for t in met}


def met_grace_period(first: Mapping[Threshold, float], now: float) -> list[Threshold]:
    return [t for t, since in first.items() if now - since >= t.grace]


def node_conditions(met: Iterable[Threshold]) -> list[str]:
    found = {t.condition for t in met}
    return [c for c in CONDITION_ORDER if c in found]


def last_observed(conditions: Iterable[str], before: Mapping[str, float],
                  now: float) -> dict[str, float]:
    return {**before, **dict.fromkeys(conditions, now)}


def observed_since(last: Mapping[str, float], period: float, now: float) -> list[str]:
    """The conditions last seen within ``period`` (evictionPressureTransitionPeriod)."""
    return [c for c in CONDITION_ORDER if c in last and now - last[c] < period]


def by_eviction_priority(met: Iterable[Threshold]) -> list[Threshold]:
    """Memory first, then disk, then PIDs (hard before soft within each)."""
    order = {c: i for i, c in enumerate(CONDITION_ORDER)}
    return sorted(met, key=lambda t: (order.get(t.condition, 9), not t.hard))


@dataclass
class PressureState:
    """What one pass carries to the next."""

    met: list[Threshold]
    first_observed: dict[Threshold, float]
    last_observed: dict[str, float]


def evaluate(thresholds: Sequence[Threshold], obs: Observations, state: PressureState,
             now: float, transition: float) -> tuple[list[Threshold], list[str], PressureState]:
    """One pass of ``synchronize``'s decisions: (the thresholds to act on now, the node
    conditions, the next state)."""
    met = thresholds_met(thresholds, obs, False)
    if state.met:
        met = merge(met, thresholds_met(state.met, obs, True))
    first = first_observed(met, state.first_observed, now)
    last = last_observed(node_conditions(met), state.last_observed, now)
    conditions = observed_since(last, transition, now)
    act = met_grace_period(first, now)
    return act, conditions, PressureState(act, first, last)
