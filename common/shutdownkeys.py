"""Graceful node shutdown's config (issue 27): the kubelet's ``shutdownGracePeriodByPodPriority``
and its migration from ``shutdownGracePeriod``/``shutdownGracePeriodCriticalPods``
(pkg/kubelet/nodeshutdown ``migrateConfig``). Parsed here, read by ``config.py`` and the
``nodeshutdown`` process."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from podvisor.common.values import ConfigError, parse_int

__all__ = ["SYSTEM_CRITICAL_PRIORITY", "ShutdownGroup", "parse_by_pod_priority",
           "shutdown_groups"]

SYSTEM_CRITICAL_PRIORITY = 2_000_000_000  # scheduling.SystemCriticalPriority


@dataclass(frozen=True)
class ShutdownGroup:
    """Pods of ``priority`` and above (up to the next group's) get ``seconds`` to stop."""

    priority: int
    seconds: int


def parse_by_pod_priority(key: str, raw: object) -> list[dict[str, int]]:
    """A list of ``{priority, shutdownGracePeriodSeconds}`` (the kubelet's field names)."""
    if not isinstance(raw, list):
        raise ConfigError(key, "expected a list of {priority, shutdownGracePeriodSeconds}")
    out: list[dict[str, int]] = []
    for i, item in enumerate(raw):
        where = f"{key}[{i}]"
        if not isinstance(item, Mapping) or set(item) - {"priority",
                                                         "shutdownGracePeriodSeconds"}:
            raise ConfigError(where, "expected {priority, shutdownGracePeriodSeconds}")
        out.append({"priority": parse_int(f"{where}.priority", item.get("priority", 0)),
                    "shutdownGracePeriodSeconds": parse_int(
                        f"{where}.shutdownGracePeriodSeconds",
                        item.get("shutdownGracePeriodSeconds", 0), minimum=0)})
    return out


def shutdown_groups(period: float, critical: float,
                    by_priority: list[dict[str, int]]) -> list[ShutdownGroup]:
    """The groups in ascending priority: ``by_priority`` when given, else the kubelet's
    migration (``period - critical`` for every pod, ``critical`` for priority >= 2e9); []:
    graceful node shutdown is off (``shutdownGracePeriod`` 0, or critical > period)."""
    if by_priority:
        return sorted((ShutdownGroup(g["priority"], g["shutdownGracePeriodSeconds"])
                       for g in by_priority), key=lambda g: g.priority)
    if period <= 0 or critical > period:
        return []
    return [ShutdownGroup(0, int(period - critical)),
            ShutdownGroup(SYSTEM_CRITICAL_PRIORITY, int(critical))]
