"""Probe results on disk: ``<rootDir>/state/probes.json``, so readiness survives a restart of
the prober (kubernetes #100277): a restarted prober publishes the saved results at once and
seeds its workers with those whose container ID still runs.

Format: ``{"version": 1, "probes": {pod uid: {container name: probes-map item}}}``. Written
atomically (tmp + rename) without fsync: the failure model is kill -9, which a completed rename
survives (the page cache outlives the process); after a power loss the containers are gone
and probed again. A corrupt file is logged, moved aside to ``probes.json.corrupt`` and treated
as empty: never fatal.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from podvisor.common.logs import EventLog

FORMAT_VERSION = 1
Saved = dict[str, dict[str, dict[str, Any]]]


class ProbeStore:
    def __init__(self, path: Path, log: EventLog) -> None:
        self.path = path
        self._log = log
        self.writes = 0

    def load(self) -> Saved:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            self._log.error("prober.store_unreadable", path=str(self.path), error=str(err))
            self._set_aside()
            return {}
        probes = raw.get("probes") if isinstance(raw, dict) else None
        if not isinstance(raw, dict) or raw.get("version") != FORMAT_VERSION \
                or not isinstance(probes, dict):
            self._log.error("prober.store_bad_format", path=str(self.path))
            self._set_aside()
            return {}
        out: Saved = {}
        for uid, containers in probes.items():
            if isinstance(containers, dict):
                good = {str(n): e for n, e in containers.items()
                        if isinstance(e, dict) and isinstance(e.get("container_id"), str)}
                if good:
                    out[str(uid)] = good
        return out

    def _set_aside(self) -> None:
        with contextlib.suppress(OSError):
            os.replace(self.path, self.path.with_name(self.path.name + ".corrupt"))

    def save(self, probes: Saved) -> None:
        """Write atomically; raises OSError (the caller logs it and retries later)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        body = json.dumps({"version": FORMAT_VERSION, "probes": probes},
                          separators=(",", ":")).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self.writes += 1
