"""Statuses on disk: ``<rootDir>/state/statuses.json``, written atomically (tmp + fsync +
rename), read back at start so a restarted status process keeps versions and
``lastTransitionTime`` (readiness does not flip across a restart).

File format: ``{"version": 1, "statuses": {uid: PodStatus}, "retired": {uid: PodStatus},
"pleg_ts": float}``; ``pleg_ts`` is the ``_health.ts`` of the PLEG cache the newest statuses were
computed from (CLOCK_MONOTONIC: a restarted status process waits for a cache at least that new).
``retired`` keeps statuses of pods that recently left ``desired`` so that a pod coming back
(e.g. the sync loop restarted and rebuilt its map) resumes its status. A corrupt file is logged,
moved aside to ``statuses.json.corrupt`` and treated as empty: never fatal.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podvisor.supervisor.logs import EventLog

FORMAT_VERSION = 1


@dataclass
class Saved:
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    retired: dict[str, dict[str, Any]] = field(default_factory=dict)
    pleg_ts: float = 0.0


class StatusStore:
    def __init__(self, path: Path, log: EventLog) -> None:
        self.path = path
        self._log = log
        self.writes = 0

    def load(self) -> Saved:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return Saved()
        except (OSError, ValueError) as err:
            self._log.error("status.store_unreadable", path=str(self.path), error=str(err))
            self._set_aside()
            return Saved()
        if not isinstance(raw, dict) or raw.get("version") != FORMAT_VERSION:
            self._log.error("status.store_bad_format", path=str(self.path))
            self._set_aside()
            return Saved()
        statuses = raw.get("statuses")
        retired = raw.get("retired")
        pleg_ts = raw.get("pleg_ts", 0.0)
        return Saved(
            {k: v for k, v in (statuses or {}).items() if isinstance(v, dict)}
            if isinstance(statuses, dict) else {},
            {k: v for k, v in (retired or {}).items() if isinstance(v, dict)}
            if isinstance(retired, dict) else {},
            float(pleg_ts) if isinstance(pleg_ts, (int, float)) else 0.0,
        )

    def _set_aside(self) -> None:
        with contextlib.suppress(OSError):
            os.replace(self.path, self.path.with_name(self.path.name + ".corrupt"))

    def save(self, saved: Saved) -> None:
        """Write atomically; an I/O error is logged and the caller retries on its next save."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = {"version": FORMAT_VERSION, "statuses": saved.statuses, "retired": saved.retired,
                "pleg_ts": saved.pleg_ts}
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, separators=(",", ":"), sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        self.writes += 1
