"""RFC 3339 timestamps as Kubernetes writes them (UTC, ``Z``): second precision for statuses,
microseconds for ``kubernetes.io/config.seen`` (the one definition of both)."""

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
    """The inverse of ``rfc3339`` (raises ValueError)."""
    import calendar

    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
