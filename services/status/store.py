"""Statuses on disk: one small file per pod under ``<rootDir>/state/statuses/``, read back at
start so a restarted status process keeps versions and ``lastTransitionTime`` (readiness does
not flip across a restart).

Layout: ``meta.json`` = ``{"version": 2, "pleg_ts": float}`` (the ``_health.ts`` of the PLEG
cache the newest statuses were computed from; CLOCK_MONOTONIC: a restarted status process waits
for a cache at least that new) and ``pod-<uid>.json`` = ``{"uid": uid, "status": PodStatus}``
per pod (a retired status, i.e. of a pod that recently left ``desired``, carries
``_retiredAt``). ``save`` writes only what changed since the last save (the caller's status
objects are compared by identity: the engine replaces a status only when it changes), so a
commit costs a few hundred microseconds per changed pod, not a rewrite of every status.

Each file is written whole to ``.<name>.tmp`` and renamed over the old one, without fsync: the
failure model is kill -9 of processes, and a completed rename survives it (the page cache
outlives the process). After a power loss the containers are gone too, statuses are recomputed
and a torn file is set aside (below). Order: ``meta.json`` before the pod files, so a kill
between them leaves a ``pleg_ts`` at least as new as the statuses on disk (the safe side).

A corrupt file is logged, moved aside to ``<name>.corrupt`` and ignored: never fatal. The
previous single-file format (``state/statuses.json``) is read when the directory does not exist
yet and removed after the first save.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podvisor.supervisor.logs import EventLog

FORMAT_VERSION = 2
LEGACY_VERSION = 1
META = "meta.json"
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,150}")


@dataclass
class Saved:
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    retired: dict[str, dict[str, Any]] = field(default_factory=dict)
    pleg_ts: float = 0.0


def pod_file(uid: str) -> str:
    """The file name for ``uid`` (hashed when the UID is not a plain file name)."""
    if _SAFE.fullmatch(uid):
        return f"pod-{uid}.json"
    return f"pod-x{hashlib.sha256(uid.encode()).hexdigest()[:40]}.json"


class StatusStore:
    def __init__(self, path: Path, log: EventLog) -> None:
        self.path = path  # the directory
        self.legacy = path.with_name(path.name + ".json")
        self._log = log
        self._written: dict[str, Any] = {}  # uid -> the status object last written
        self._pleg_ts: float | None = None
        self._legacy_pending = False
        self.writes = 0  # saves that wrote something
        self.files = 0  # files written

    def load(self) -> Saved:
        self._written, self._pleg_ts = {}, None
        if not self.path.is_dir():
            saved = self._load_legacy()
            self._legacy_pending = self.legacy.exists()
            return saved
        saved = Saved(pleg_ts=self._load_meta())
        self._pleg_ts = saved.pleg_ts
        for entry in sorted(self.path.glob("pod-*.json")):
            item = self._read(entry)
            uid, status = (item or {}).get("uid"), (item or {}).get("status")
            if not isinstance(uid, str) or not isinstance(status, dict):
                if item is not None:
                    self._bad(entry, "not a pod status file")
                continue
            (saved.retired if "_retiredAt" in status else saved.statuses)[uid] = status
            self._written[uid] = status
        return saved

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            self._bad(path, str(err))
            return None
        return raw if isinstance(raw, dict) else {}

    def _load_meta(self) -> float:
        raw = self._read(self.path / META)
        if raw is None:
            return 0.0
        ts = raw.get("pleg_ts")
        if raw.get("version") != FORMAT_VERSION or not isinstance(ts, (int, float)):
            self._bad(self.path / META, "bad format")
            return 0.0
        return float(ts)

    def _bad(self, path: Path, error: str) -> None:
        self._log.error("status.store_unreadable", path=str(path), error=error)
        with contextlib.suppress(OSError):
            os.replace(path, path.with_name(path.name + ".corrupt"))

    def _load_legacy(self) -> Saved:
        """``state/statuses.json`` as written before per-pod files (format version 1)."""
        raw = self._read(self.legacy)
        if raw is None:
            return Saved()
        if raw.get("version") != LEGACY_VERSION:
            self._bad(self.legacy, "bad format")
            return Saved()
        statuses, retired, ts = raw.get("statuses"), raw.get("retired"), raw.get("pleg_ts")
        return Saved(
            {k: v for k, v in statuses.items() if isinstance(v, dict)}
            if isinstance(statuses, dict) else {},
            {k: v for k, v in retired.items() if isinstance(v, dict)}
            if isinstance(retired, dict) else {},
            float(ts) if isinstance(ts, (int, float)) else 0.0)

    def _write(self, name: str, data: dict[str, Any]) -> None:
        tmp = self.path / f".{name}.tmp"
        body = json.dumps(data, separators=(",", ":")).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
        os.replace(tmp, self.path / name)
        self.files += 1

    def save(self, saved: Saved) -> None:
        """Write what changed since the last save; raises OSError (the caller logs it and
        saves again later: what did not make it is still unwritten)."""
        self.path.mkdir(parents=True, exist_ok=True)
        files = self.files
        if saved.pleg_ts != self._pleg_ts:
            self._write(META, {"version": FORMAT_VERSION, "pleg_ts": saved.pleg_ts})
            self._pleg_ts = saved.pleg_ts
        current = {**saved.retired, **saved.statuses}
        for uid, status in current.items():
            if self._written.get(uid) is not status:
                self._write(pod_file(uid), {"uid": uid, "status": status})
                self._written[uid] = status
        for uid in [u for u in self._written if u not in current]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path / pod_file(uid))
            del self._written[uid]
        if self._legacy_pending:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.legacy)
            self._legacy_pending = False
        if self.files != files:
            self.writes += 1
