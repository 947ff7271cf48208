"""The keeper of events: a bounded ring that aggregates identical events, persisted to disk.

Like the kubelet's event recorder (``EventCorrelator``): an event with the same source, type,
reason, involved object and message as one already kept is not stored again; that one's
``count`` grows and its ``last_ts`` moves. The ring keeps the ``capacity`` (1000) most recently
seen; the oldest are dropped. The ring is written to ``<rootDir>/state/events.jsonl`` (one
JSON object per line, atomically replaced) at most every ``persist_interval`` seconds, and read
back on start, so ``podvisorctl events`` answers across agent restarts. One thread.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from podvisor.common.timefmt import rfc3339
from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.messages import Event

CAPACITY = 1000
PERSIST_INTERVAL = 1.0
MAX_MESSAGE = 1024  # as the API server's event message limit
_FIELDS = ("type", "reason", "message", "object", "source", "count", "first_ts", "last_ts")

Record = dict[str, Any]


def _key(r: Mapping[str, Any]) -> str:
    return json.dumps([r["source"], r["type"], r["reason"], r["object"], r["message"]],
                      sort_keys=True)


def _record(event: Event) -> Record:
    message = event.message if len(event.message) <= MAX_MESSAGE else \
        event.message[:MAX_MESSAGE - 3] + "..."
    obj = {str(k): v for k, v in event.object.items() if v not in (None, "")} \
        if isinstance(event.object, dict) else {}
    last = event.last_ts or event.first_ts or SYSTEM_CLOCK.wall()
    return {"type": str(event.type), "reason": str(event.reason), "message": message,
            "object": obj, "source": str(event.source), "count": max(1, int(event.count)),
            "first_ts": float(event.first_ts or last), "last_ts": float(last)}


def _valid(r: Any) -> bool:
    return (isinstance(r, dict) and all(k in r for k in _FIELDS)
            and isinstance(r["object"], dict) and isinstance(r["count"], int)
            and isinstance(r["first_ts"], (int, float)) and isinstance(r["last_ts"], (int, float)))


class EventStore:
    def __init__(self, path: Path | None, capacity: int = CAPACITY,
                 persist_interval: float = PERSIST_INTERVAL,
                 clock: Callable[[], float] = SYSTEM_CLOCK.monotonic) -> None:
        self.path = path
        self.capacity = capacity
        self.persist_interval = persist_interval
        self._clock = clock
        self._ring: OrderedDict[str, Record] = OrderedDict()
        self._lines: dict[str, str] = {}  # key -> the record's JSON line, once written
        self._dirty = False
        self._last_write = float("-inf")
        self.received = 0
        self.write_errors = 0

    # --- in ---
    def add(self, event: Event) -> Record:
        self.received += 1
        rec = _record(event)
        key = _key(rec)
        old = self._ring.pop(key, None)
        self._lines.pop(key, None)
        if old is not None:
            rec["count"] = old["count"] + rec["count"]
            rec["first_ts"] = min(old["first_ts"], rec["first_ts"])
            rec["last_ts"] = max(old["last_ts"], rec["last_ts"])
        self._ring[key] = rec
        while len(self._ring) > self.capacity:
            self._lines.pop(self._ring.popitem(last=False)[0], None)
        self._dirty = True
        return rec

    def load(self) -> int:
        """Read the persisted ring (bad lines are skipped); returns how many were read."""
        if self.path is None:
            return 0
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return 0
        n = 0
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                r = json.loads(line)
                if _valid(r):
                    key = _key(r)
                    self._ring[key] = {k: r[k] for k in _FIELDS}
                    self._lines.pop(key, None)
                    n += 1
        while len(self._ring) > self.capacity:
            self._lines.pop(self._ring.popitem(last=False)[0], None)
        return n

    # --- persistence ---
    def next_deadline(self) -> float | None:
        """When ``persist`` should next run (monotonic), or None when nothing changed."""
        return self._last_write + self.persist_interval if self._dirty else None

    def persist(self, force: bool = False) -> bool:
        """Write the ring if it changed and the interval passed (or ``force``)."""
        if not self._dirty or self.path is None:
            return False
        now = self._clock()
        if not force and now < self._last_write + self.persist_interval:
            return False
        self._last_write = now
        self._dirty = False
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lines = self._lines
            for key, r in self._ring.items():  # a record is rendered once, not every write
                if key not in lines:
                    lines[key] = json.dumps(r, sort_keys=True) + "\n"
            if len(lines) > len(self._ring):
                self._lines = lines = {k: lines[k] for k in self._ring}
            with tmp.open("w", encoding="utf-8") as out:
                out.write("".join(lines[k] for k in self._ring))
            os.replace(tmp, self.path)
        except OSError:
            self.write_errors += 1
            return False
        return True

    # --- out ---
    def records(self) -> list[Record]:
        """Oldest first (by last seen)."""
        return sorted(self._ring.values(), key=lambda r: r["last_ts"])

    def event_list(self, limit: int | None = None) -> dict[str, Any]:
        """A Kubernetes ``EventList`` (the ``events`` command's result)."""
        recs = self.records()
        if limit is not None:
            recs = recs[-limit:] if limit > 0 else []
        return {"kind": "EventList", "apiVersion": "v1", "items": [render(r) for r in recs]}


def render(r: Record) -> dict[str, Any]:
    return {"type": r["type"], "reason": r["reason"], "message": r["message"],
            "involvedObject": dict(r["object"]), "source": {"component": r["source"]},
            "count": r["count"], "firstTimestamp": rfc3339(r["first_ts"]),
            "lastTimestamp": rfc3339(r["last_ts"])}
