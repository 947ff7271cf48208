"""source-api's resume point: the last ``resourceVersion`` it saw together with the set of raw
pods that version stands for, kept in ``<rootDir>/state/source-api.json`` so that a restarted
``source-api`` (kill -9, a crash, the whole agent) republishes that set at once and watches on
from that version, without a full relist, while the API server still has it (a ``410 Gone``
answer makes the reflector relist as on a first start).

The file is written atomically (temporary file, fsync, rename), at most every
``SAVE_INTERVAL`` seconds while the watch advances and once more on a clean stop. A stale file
is still consistent: an older version with the set it stands for, from which the watch replays
what came after. A file for another server, another node or another selector, or one that
cannot be read or parsed, is not used (logged; the reflector lists as on a first start).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podvisor.common.logs import EventLog

FORMAT_VERSION = 1
SAVE_INTERVAL = 5.0
FILE_NAME = "source-api.json"
Obj = dict[str, Any]


@dataclass(frozen=True)
class ResumePoint:
    rv: str
    items: list[Obj]


class ResumeStore:
    """Load/save of the resume point for one (server, node, selector)."""

    def __init__(self, path: Path, log: EventLog, *, server: str, selector: str) -> None:
        self.path = path
        self._log = log
        self._key = {"server": server, "selector": selector}
        self.writes = 0

    def load(self) -> ResumePoint | None:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            self._log.error("source.api.resume_unreadable", path=str(self.path), error=str(err))
            self._set_aside()
            return None
        items = raw.get("items") if isinstance(raw, dict) else None
        rv = raw.get("resourceVersion") if isinstance(raw, dict) else None
        if not isinstance(raw, dict) or raw.get("version") != FORMAT_VERSION or \
                not isinstance(items, list) or not isinstance(rv, str) or not rv:
            self._log.error("source.api.resume_bad_format", path=str(self.path))
            self._set_aside()
            return None
        if any(raw.get(k) != v for k, v in self._key.items()):
            self._log.info("source.api.resume_other", path=str(self.path),
                           reason="saved for another server or selector")
            return None
        return ResumePoint(rv, [i for i in items if isinstance(i, dict)])

    def save(self, rv: str, items: list[Obj]) -> None:
        """Write atomically; raises OSError (the caller logs it and retries later)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        body = json.dumps({"version": FORMAT_VERSION, **self._key, "resourceVersion": rv,
                           "items": items}, separators=(",", ":")).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self.writes += 1

    def _set_aside(self) -> None:
        with contextlib.suppress(OSError):
            os.replace(self.path, self.path.with_name(self.path.name + ".corrupt"))
