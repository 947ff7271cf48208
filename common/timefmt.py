"""RFC 3339 timestamps as Kubernetes writes them (UTC, ``Z``): second precision for statuses
and events (``metav1.Time``), microseconds for ``kubernetes.io/config.seen`` and leases
(``metav1.MicroTime``), and the parser of what the API and the CRI write (the one definition of
each)."""

from __future__ import annotations

import functools
import math
import time
from datetime import UTC, datetime


def rfc3339(wall: float) -> str:
    return _second(math.floor(wall))


@functools.lru_cache(maxsize=1024)
def _second(second: int) -> str:
    """Second precision: a burst of statuses formats the same few seconds over and over."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))


def rfc3339_micro(wall_seconds: float) -> str:
    """Wall-clock seconds -> ``2024-05-01T12:00:00.123456Z``."""
    return datetime.fromtimestamp(wall_seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339_ns(ns: int) -> str | None:
    """A CRI nanosecond timestamp; None for 0 (never happened)."""
    return rfc3339(ns / 1e9) if ns > 0 else None


def parse_rfc3339(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 time: the inverse of ``rfc3339``, and of the
    fractional (nanoseconds cut to microseconds) and offset forms the API and the CRI logs
    write. Raises ValueError (a time without a zone included)."""
    raw = text.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    main, dot, rest = raw.partition(".")
    if dot:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        rest = rest[:min(digits, 6)] + rest[digits:]
        raw = main + "." + rest if rest[:1].isdigit() else main + rest
    when = datetime.fromisoformat(raw)
    if when.tzinfo is None:
        raise ValueError("no time zone")
    return when.timestamp()
