"""Logging a source's results without repeating itself on every relist."""

from __future__ import annotations

from podvisor.services.sources.common import SourceSet
from podvisor.supervisor.logs import EventLog


class Reporter:
    """Logs each rejection (``source.pod.invalid``), each ignored unsupported field
    (``source.pod.warning``) and each skipped entry (``source.skipped``) when it first
    appears, and ``source.set`` when the set's summary changes. ``key`` is "file" or "url"."""

    def __init__(self, log: EventLog, key: str) -> None:
        self._log = log
        self._key = key
        self._errors: set[tuple[str, str, str]] = set()
        self._warnings: set[tuple[str, str, str]] = set()
        self._notes: set[str] = set()
        self._summary: tuple[int, int, frozenset[str]] | None = None

    def report(self, result: SourceSet) -> None:
        errors = {(e.location, e.field, e.reason) for e in result.errors}
        for location, field, reason in sorted(errors - self._errors):
            self._log.warning("source.pod.invalid", **{self._key: location}, field=field,
                              reason=reason)
        for location, field, reason in sorted(self._errors - errors):
            self._log.info("source.pod.error_cleared", **{self._key: location}, field=field,
                           reason=reason)
        self._errors = errors
        warnings = {(p.origin.location, p.name, w) for p in result.pods
                    if p.origin is not None for w in p.origin.warnings}
        for location, pod, warning in sorted(warnings - self._warnings):
            self._log.warning("source.pod.warning", **{self._key: location}, pod=pod,
                              reason=warning)
        self._warnings = warnings
        for note in sorted(set(result.notes) - self._notes):
            self._log.info("source.skipped", note=note)
        self._notes = set(result.notes)
        summary = (len(result.pods), len(result.errors), frozenset(p.uid for p in result.pods))
        if summary != self._summary:
            self._log.info("source.set", source=result.source, pods=summary[0],
                           errors=summary[1], names=[p.name for p in result.pods])
        self._summary = summary
