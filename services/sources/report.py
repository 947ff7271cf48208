"""Logging a source's results without repeating itself on every relist."""

from __future__ import annotations

from podvisor.common.logs import EventLog
from podvisor.services import events as ev
from podvisor.services.events import Recorder
from podvisor.services.pod import Pod
from podvisor.services.sources.common import SourceSet


def duplicates(result: SourceSet) -> list[tuple[Pod, str]]:
    """Each pod whose namespace/name an earlier pod of the set already has, with that earlier
    pod's location (the sync loop keeps the first, as the kubelet's ``filterInvalidPods``)."""
    first: dict[tuple[str, str], str] = {}
    out: list[tuple[Pod, str]] = []
    for pod in result.pods:
        key = (pod.metadata.namespace, pod.metadata.name)
        where = pod.origin.location if pod.origin is not None else ""
        if key in first:
            out.append((pod, first[key]))
        else:
            first[key] = where
    return out


class Reporter:
    """Logs each rejection (``source.pod.invalid``), each ignored unsupported field
    (``source.pod.warning``), each duplicate name (``source.pod.duplicate``) and each skipped
    entry (``source.skipped``) when it first appears, and ``source.set`` when the set's summary
    changes. With ``events``, each new rejection, warning and duplicate is also recorded as a
    Warning event (see ``services/events/model.py`` for the reasons). ``key`` is "file" or
    "url"."""

    def __init__(self, log: EventLog, key: str, events: Recorder | None = None) -> None:
        self._log = log
        self._key = key
        self._events = events
        self._errors: set[tuple[str, str, str]] = set()
        self._warnings: set[tuple[str, str, str]] = set()
        self._dups: set[tuple[str, str, str]] = set()
        self._notes: set[str] = set()
        self._summary: tuple[int, int, frozenset[str]] | None = None

    def _event(self, reason: str, message: str, obj: dict[str, object]) -> None:
        if self._events is not None:
            self._events.record(ev.WARNING, reason, message, obj)

    def report(self, result: SourceSet) -> None:
        errors = {(e.location, e.field, e.reason) for e in result.errors}
        for location, field, reason in sorted(errors - self._errors):
            code = ev.manifest_error_reason(field, reason)
            self._log.warning("source.pod.invalid", **{self._key: location}, field=field,
                              reason=reason, code=code)
            what = f"{field}: {reason}" if field else reason
            self._event(code, f"{location}: {what}", ev.manifest_object(self._key, location))
        for location, field, reason in sorted(self._errors - errors):
            self._log.info("source.pod.error_cleared", **{self._key: location}, field=field,
                           reason=reason)
        self._errors = errors
        self._report_warnings(result)
        self._report_duplicates(result)
        for note in sorted(set(result.notes) - self._notes):
            self._log.info("source.skipped", note=note)
        self._notes = set(result.notes)
        summary = (len(result.pods), len(result.errors), frozenset(p.uid for p in result.pods))
        if summary != self._summary:
            self._log.info("source.set", source=result.source, pods=summary[0],
                           errors=summary[1], names=[p.name for p in result.pods])
        self._summary = summary

    def _report_warnings(self, result: SourceSet) -> None:
        pods = {}
        warnings = set()
        for p in result.pods:
            if p.origin is None:
                continue
            for w in p.origin.warnings:
                warnings.add((p.origin.location, p.name, w))
                pods[(p.origin.location, p.name)] = p
        for location, name, warning in sorted(warnings - self._warnings):
            self._log.warning("source.pod.warning", **{self._key: location}, pod=name,
                              reason=warning)
            p = pods[(location, name)]
            self._event(ev.UNSUPPORTED_FIELD, f"{location}: {warning}",
                        ev.pod_object(p.metadata.name, p.metadata.namespace, p.uid,
                                      file=location))
        self._warnings = warnings

    def _report_duplicates(self, result: SourceSet) -> None:
        found = {}
        for pod, first in duplicates(result):
            where = pod.origin.location if pod.origin is not None else ""
            found[(where, pod.metadata.namespace + "/" + pod.metadata.name, first)] = pod
        for key in sorted(set(found) - self._dups):
            where, full, first = key
            reason = (f"duplicate pod name {full!r}: {first} already defines it; this "
                      "manifest is ignored")
            self._log.warning("source.pod.duplicate", **{self._key: where}, pod=full,
                              first=first, reason=reason, code=ev.DUPLICATE_POD_NAME)
            p = found[key]
            self._event(ev.DUPLICATE_POD_NAME, f"{where}: {reason}",
                        ev.pod_object(p.metadata.name, p.metadata.namespace, p.uid,
                                      file=where))
        self._dups = set(found)
