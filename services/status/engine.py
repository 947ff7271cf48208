"""The status engine: which statuses to (re)compute, retire and publish. No I/O.

``StatusEngine.reconcile(desired, pleg, now)`` recomputes every pod's status from the two
replicated maps (``desired`` from syncloop, ``pleg`` from pleg) and returns the changes to apply to
the ``statuses`` map. It refuses to run (returns None) until the PLEG map carries ``_health``:
an empty map from a PLEG that has not relisted yet must not turn Running pods into Pending.
Statuses of pods that left ``desired`` are retired (kept for ``RETIRE_AFTER`` seconds) so a pod
that comes back resumes its versions and transition times.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from podvisor.services.status.compute import compute_pod_status
from podvisor.services.status.store import Saved
from podvisor.services.status.timefmt import parse_rfc3339, rfc3339

RETIRE_AFTER = 600.0
HEALTH_KEY = "_health"


@dataclass(frozen=True)
class Changes:
    set: dict[str, dict[str, Any]] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.set or self.deleted)


class StatusEngine:
    def __init__(self, saved: Saved, runtime: str = "embedded", host_ip: str = "127.0.0.1"
                 ) -> None:
        self.statuses: dict[str, dict[str, Any]] = dict(saved.statuses)
        self.retired: dict[str, dict[str, Any]] = dict(saved.retired)
        self._runtime = runtime
        self._host_ip = host_ip

    def saved(self) -> Saved:
        return Saved(dict(self.statuses), dict(self.retired))

    def reconcile(
        self, desired: Mapping[str, Any], pleg: Mapping[str, Any], now: float
    ) -> Changes | None:
        if HEALTH_KEY not in pleg:
            return None
        changes = Changes()
        for uid, entry in desired.items():
            if uid.startswith("_") or not isinstance(entry, Mapping):
                continue
            previous = self.statuses.get(uid)
            if previous is None and uid in self.retired:
                previous = {k: v for k, v in self.retired.pop(uid).items() if k != "_retiredAt"}
            status = compute_pod_status(entry, pleg.get(uid), previous, now, self._runtime,
                                        self._host_ip)
            if status != previous or uid not in self.statuses:
                self.statuses[uid] = status
                changes.set[uid] = status
        for uid in sorted(self.statuses.keys() - desired.keys()):
            self.retired[uid] = {**self.statuses.pop(uid), "_retiredAt": rfc3339(now)}
            changes.deleted.append(uid)
        self._expire(now)
        return changes

    def _expire(self, now: float) -> None:
        for uid, status in list(self.retired.items()):
            try:
                when = parse_rfc3339(str(status.get("_retiredAt", "")))
            except ValueError:
                when = 0.0
            if now - when > RETIRE_AFTER:
                del self.retired[uid]
