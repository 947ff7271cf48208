"""CPU and memory history for the node page's charts (pure: no I/O, every time passed in).

A sample is one instant (wall seconds) and, per key, CPU in millicores and memory in KiB. Keys
are the names the page already uses: ``agent:NAME`` (a subsystem), ``NS.POD`` (a pod: the sum
of its containers) and ``NS.POD:CONTAINER``. ``UsageStore`` keeps:

- ``fine``: every sample of the last ``fine_window`` (10 minutes: full resolution);
- ``coarse``: one point per ``coarse_step`` (30 s) over the last ``window`` (an hour), the mean
  of the fine samples that fell in that step;
- ``marks``: restarts and faults over the last ``window`` (``Mark``), drawn on the same time
  axis.

``history()`` gives both as columns (one time array shared by every series: what a charting
library draws without re-aligning), ``frame_of()`` one sample as the live feed sends it.
``cpu_millis`` turns two cumulative CPU readings into a rate.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["COARSE_STEP", "FINE_WINDOW", "WINDOW", "Mark", "Sample", "UsageStore",
           "cpu_millis", "frame_of", "sum_pods"]

FINE_WINDOW = 600.0
COARSE_STEP = 30.0
WINDOW = 3600.0

Usage = tuple[int, int]  # (CPU millicores, memory KiB)


@dataclass(frozen=True)
class Sample:
    t: float  # wall seconds
    values: Mapping[str, Usage]


@dataclass(frozen=True)
class Mark:
    """A restart or a fault of ``name`` at ``t`` (wall seconds); ``text`` says what."""

    t: float
    name: str
    kind: str  # "restart" | "fault"
    text: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"t": round(self.t, 3), "name": self.name, "kind": self.kind, "text": self.text}


def cpu_millis(prev: tuple[float, int] | None, cur: tuple[float, int]) -> int | None:
    """Millicores from two (seconds, cumulative CPU nanoseconds) readings of one process or
    container (None: no earlier reading, or time did not move; a counter that went back, a new
    process under the same key, reads 0 rather than a negative rate)."""
    if prev is None or cur[0] <= prev[0]:
        return None
    return max(0, round((cur[1] - prev[1]) / (cur[0] - prev[0]) / 1e6))


def sum_pods(values: Mapping[str, Usage]) -> dict[str, Usage]:
    """Each pod's usage (``NS.POD``) as the sum of its containers' (``NS.POD:NAME``)."""
    out: dict[str, Usage] = {}
    for key, (cpu, mem) in values.items():
        group, sep, _ = key.partition(":")
        if not sep or group == "agent":
            continue
        c, m = out.get(group, (0, 0))
        out[group] = (c + cpu, m + mem)
    return out


def _mean(samples: list[Sample], t: float) -> Sample:
    sums: dict[str, list[int]] = {}
    for s in samples:
        for key, (cpu, mem) in s.values.items():
            acc = sums.setdefault(key, [0, 0, 0])
            acc[0] += cpu
            acc[1] += mem
            acc[2] += 1
    return Sample(t, {k: (round(c / n), round(m / n)) for k, (c, m, n) in sums.items()})


def _columns(samples: Iterable[Sample]) -> dict[str, Any]:
    rows = list(samples)
    keys = sorted({k for s in rows for k in s.values})
    series: dict[str, list[list[int | None]]] = {}
    for key in keys:
        cpu: list[int | None] = []
        mem: list[int | None] = []
        for s in rows:
            v = s.values.get(key)
            cpu.append(None if v is None else v[0])
            mem.append(None if v is None else v[1])
        series[key] = [cpu, mem]
    return {"t": [round(s.t, 3) for s in rows], "series": series}


class UsageStore:
    """Samples and marks over the last hour (not thread-safe: the caller holds a lock)."""

    def __init__(self, interval: float, fine_window: float = FINE_WINDOW,
                 coarse_step: float = COARSE_STEP, window: float = WINDOW) -> None:
        self.interval, self.fine_window = interval, fine_window
        self.coarse_step, self.window = coarse_step, window
        self.fine: deque[Sample] = deque()
        self.coarse: deque[Sample] = deque()
        self.marks: deque[Mark] = deque(maxlen=10_000)
        self._bucket: list[Sample] = []
        self._bucket_end = 0.0
        self._now = 0.0  # the latest time seen (a mark may come with an earlier one)

    def add(self, sample: Sample) -> None:
        t = sample.t
        if self._bucket and t >= self._bucket_end:
            self.coarse.append(_mean(self._bucket, self._bucket_end - self.coarse_step / 2))
            self._bucket = []
        if not self._bucket:
            self._bucket_end = (t // self.coarse_step + 1) * self.coarse_step
        self._bucket.append(sample)
        self.fine.append(sample)
        self._trim(t)

    def mark(self, mark: Mark) -> None:
        """Keep ``mark`` unless it is older than the window already."""
        self._now = max(self._now, mark.t)
        if mark.t >= self._now - self.window:
            self.marks.append(mark)
        self._trim(self._now)

    def _trim(self, now: float) -> None:
        self._now = now = max(self._now, now)
        while self.fine and self.fine[0].t < now - self.fine_window:
            self.fine.popleft()
        while self.coarse and self.coarse[0].t < now - self.window:
            self.coarse.popleft()
        while self.marks and self.marks[0].t < now - self.window:
            self.marks.popleft()

    def latest(self) -> Sample | None:
        return self.fine[-1] if self.fine else None

    def history(self) -> dict[str, Any]:
        """Everything kept, as columns: ``fine`` (full resolution), ``coarse`` (the hour: the
        coarse points, then the step in progress as its mean so far) and ``marks``."""
        coarse = list(self.coarse)
        if self._bucket:
            coarse.append(_mean(self._bucket, self._bucket[-1].t))
        return {"interval": self.interval, "fineWindow": self.fine_window,
                "coarseStep": self.coarse_step, "window": self.window,
                "fine": _columns(self.fine), "coarse": _columns(coarse),
                "marks": [m.to_json() for m in self.marks]}


def frame_of(sample: Sample, marks: Iterable[Mark],
             extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One sample as the live feed's ``usage`` event: ``{"t", "v": {key: [cpu, mem]},
    "marks": [...], ...extra}`` (the marks made since the previous one)."""
    return {"t": round(sample.t, 3), "v": {k: list(v) for k, v in sample.values.items()},
            "marks": [m.to_json() for m in marks], **(extra or {})}
