"""A minimal JSON-lines logger for the standalone runtime (the supervised process gets the
supervisor's EventLogger instead; both have the same info/warning/error(event, **fields))."""

from __future__ import annotations

import json
import sys
import threading
from typing import Any, TextIO

from podvisor.ipc.clock import SYSTEM_CLOCK


class JsonLogger:
    def __init__(self, subsystem: str, stream: TextIO = sys.stderr) -> None:
        self._subsystem = subsystem
        self._stream = stream
        self._lock = threading.Lock()

    def _emit(self, level: str, event: str, fields: dict[str, Any]) -> None:
        record = {"ts": SYSTEM_CLOCK.wall(), "level": level, "subsystem": self._subsystem,
                  "event": event, **fields}
        line = json.dumps(record, default=str)
        with self._lock:
            try:
                self._stream.write(line + "\n")
                self._stream.flush()
            except (OSError, ValueError):
                pass

    def debug(self, event: str, **fields: Any) -> None:
        self._emit("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit("error", event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._emit("error", event, fields)
