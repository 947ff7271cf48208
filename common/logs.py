"""Structured logs: one JSON object per line, to stderr and to a size-rotated `logs/<name>.log`.

Every line has `ts` (UTC, RFC 3339), `level`, `subsystem` (the process name), `event` (a dotted
name such as `process.exited`) and any extra fields (`pod`, `container`, `pid`, ...). Records from
third-party libraries that use stdlib `logging` come out the same way, their message as `event`.

`EventLogger` is the logger handed to every process (`ctx.log`); `MemoryLogger` is its fake for
unit tests (it keeps event dicts). Thread-safe (stdlib logging handlers lock). Never log from a
signal handler.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import stat
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, TextIO

__all__ = ["EventLog", "EventLogger", "JsonFormatter", "MemoryLogger", "setup_logging"]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


class Log(Protocol):
    """The logger protocol: what code that only logs needs (the one definition; the standalone
    runtime's ``JsonLogger`` and ``EventLogger`` both satisfy it)."""

    def debug(self, event: str, **fields: Any) -> None: ...
    def info(self, event: str, **fields: Any) -> None: ...
    def warning(self, event: str, **fields: Any) -> None: ...
    def error(self, event: str, **fields: Any) -> None: ...
    def exception(self, event: str, **fields: Any) -> None: ...


class EventLog(Log, Protocol):
    """The logging interface every process uses: ``Log`` and ``bind``."""

    def bind(self, **fields: Any) -> EventLog: ...


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line."""

    def __init__(self, subsystem: str) -> None:
        super().__init__()
        self.subsystem = subsystem

    def format(self, record: logging.LogRecord) -> str:
        """The record's line, rendered once and kept on the record (every handler, and the
        rotating file handler's size check, would otherwise render it again)."""
        line = record.__dict__.get("_pv_line")
        if line is None or record.__dict__.get("_pv_formatter") is not self:
            line = self._render(record)
            record.__dict__["_pv_line"] = line
            record.__dict__["_pv_formatter"] = self
        return str(line)

    def _render(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "subsystem": getattr(record, "subsystem", self.subsystem),
            "event": record.getMessage(),
        }
        extra: Mapping[str, Any] = getattr(record, "event_fields", {})
        for key, value in extra.items():
            out.setdefault(key, value)
        if getattr(record, "event_fields", None) is None and record.name != "root":
            out["logger"] = record.name
        if record.exc_info and record.exc_info[0] is not None:
            out["exc"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return json.dumps(out, default=str, ensure_ascii=False)


class EventLogger:
    """Logs events with fields through a stdlib logger. `bind()` returns a logger that adds
    fixed fields (e.g. `pod=`) to every event."""

    def __init__(self, logger: logging.Logger, subsystem: str,
                 fields: Mapping[str, Any] | None = None) -> None:
        self._logger = logger
        self._subsystem = subsystem
        self._fields = dict(fields or {})

    def _log(self, level: int, event: str, fields: dict[str, Any], exc: bool = False) -> None:
        logger = self._logger
        if not logger.isEnabledFor(level):
            return
        merged = {**self._fields, **fields}
        # makeRecord + handle: what Logger.log does, minus the caller lookup (a stack walk per
        # record for a file and line the JSON lines never show)
        record = logger.makeRecord(
            logger.name, level, "(podvisor)", 0, "%s", (event,),
            sys.exc_info() if exc else None,
            extra={"event_fields": merged, "subsystem": self._subsystem})
        logger.handle(record)

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """An error event with the current exception's traceback in `exc`."""
        self._log(logging.ERROR, event, fields, exc=True)

    def bind(self, **fields: Any) -> EventLogger:
        return EventLogger(self._logger, self._subsystem, {**self._fields, **fields})


class MemoryLogger:
    """Fake `EventLog` for unit tests: keeps every event as a dict in `events`."""

    def __init__(self, fields: Mapping[str, Any] | None = None,
                 sink: list[dict[str, Any]] | None = None) -> None:
        self._fields = dict(fields or {})
        self.events: list[dict[str, Any]] = sink if sink is not None else []

    def _add(self, level: str, event: str, fields: dict[str, Any]) -> None:
        self.events.append({"level": level, "event": event, **self._fields, **fields})

    def debug(self, event: str, **fields: Any) -> None:
        self._add("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._add("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._add("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._add("error", event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._add("error", event, {**fields, "exc": traceback.format_exc()})

    def bind(self, **fields: Any) -> MemoryLogger:
        return MemoryLogger({**self._fields, **fields}, self.events)

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == event]


class _RotatingFileHandler(logging.handlers.RotatingFileHandler):
    """``RotatingFileHandler`` that keeps its own count of the file's size: the stdlib one
    stats the file twice and seeks for every record. The count starts from ``fstat`` of the
    open file (and again after each rollover); only regular files are rotated (bpo-45401)."""

    _size: int | None = None
    _regular = True

    def shouldRollover(self, record: logging.LogRecord) -> bool:
        if self.stream is None:
            self.stream = self._open()
        if self._size is None:
            try:
                info = os.fstat(self.stream.fileno())
                self._size, self._regular = info.st_size, stat.S_ISREG(info.st_mode)
            except (OSError, ValueError):
                self._size, self._regular = 0, False
        size = len(self.format(record)) + 1
        if self.maxBytes > 0 and self._regular and self._size + size >= self.maxBytes:
            self._size = None  # counted again from the new file
            return True
        self._size += size
        return False


def setup_logging(
    name: str,
    logs_dir: Path | None,
    level: str = "info",
    max_bytes: int = 10 * 1024 * 1024,
    backups: int = 3,
    stream: TextIO | None = None,
) -> EventLogger:
    """Route this process's logging (root logger included) to JSON lines on `stream` (stderr by
    default) and, when `logs_dir` is given, to `logs_dir/<name>.log` rotated at `max_bytes`."""
    formatter = JsonFormatter(name)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    handlers: list[logging.Handler] = [logging.StreamHandler(stream or sys.stderr)]
    if logs_dir is not None:
        logs_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(_RotatingFileHandler(
            logs_dir / f"{name}.log", maxBytes=max_bytes, backupCount=backups, encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(_LEVELS.get(level, logging.INFO))
    return EventLogger(logging.getLogger(f"podvisor.{name}"), name)
