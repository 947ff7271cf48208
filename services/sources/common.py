"""What both static pod sources share: the result type, pod building, first-seen times."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from podvisor.ipc.messages import PodSet
from podvisor.services.pod import (
    CONFIG_SEEN_ANNOTATION,
    FieldIssue,
    ParsedPod,
    Pod,
    PodValidationError,
    apply_static_defaults,
    canonical_json,
    rfc3339,
)

# The API server's object size limit; a bigger pod is rejected (YAML aliases can make a small
# file decode into a huge pod, and every pod travels on the bus).
MAX_POD_BYTES = 1536 * 1024
# The bus takes 16 MiB per message; a set past this budget drops its last pods with an error.
MAX_SET_BYTES = 12 * 1024 * 1024

Seen = Callable[[str], str]


@dataclass(frozen=True)
class SourceError:
    """One rejected input: ``location`` is the file path or URL, ``field`` may be empty."""

    location: str
    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.location}: {self.field}: {self.reason}" if self.field else \
            f"{self.location}: {self.reason}"


@dataclass(frozen=True)
class SourceSet:
    """The full result of one read of a source: valid pods in order, and every rejection.
    ``notes`` are inputs skipped on purpose (subdirectories, special files), for the log."""

    source: str
    pods: tuple[Pod, ...] = ()
    errors: tuple[SourceError, ...] = ()
    notes: tuple[str, ...] = ()

    def to_message(self, ts: float) -> PodSet:
        key = "file" if self.source == "file" else "url"
        return PodSet(source=self.source, pods=[p.to_dict() for p in self.pods],
                      errors=[{key: e.location, "field": e.field, "reason": e.reason}
                              for e in self.errors], ts=ts)


def errors_of(exc: PodValidationError) -> list[SourceError]:
    return [SourceError(exc.where, issue.field, issue.reason) for issue in exc.errors]


def build_static_pod(parsed: ParsedPod, *, node_name: str, source: str, location: str,
                     seen: Seen) -> Pod:
    """Static defaults + first-seen time + size check. Raises ``PodValidationError``."""
    warnings = tuple(str(w) for w in parsed.warnings)
    pod = apply_static_defaults(parsed.pod, node_name=node_name, source=source,
                                location=location, seen="", warnings=warnings)
    pod = pod.with_annotations({CONFIG_SEEN_ANNOTATION: seen(pod.uid)})
    if len(canonical_json(pod.to_dict())) > MAX_POD_BYTES:
        raise PodValidationError(location, [FieldIssue(
            "", f"pod is larger than {MAX_POD_BYTES // 1024} KiB once decoded")])
    return pod


def within_budget(source_set: SourceSet) -> SourceSet:
    """Drop the pods past ``MAX_SET_BYTES`` (reported as errors) so the set fits one message."""
    total = 0
    kept: list[Pod] = []
    errors = list(source_set.errors)
    for pod in source_set.pods:
        total += len(canonical_json(pod.to_dict()))
        if total > MAX_SET_BYTES:
            location = pod.origin.location if pod.origin else pod.name
            errors.append(SourceError(location, "", "the source's pods together exceed "
                                      f"{MAX_SET_BYTES // (1024 * 1024)} MiB; pod left out"))
        else:
            kept.append(pod)
    if len(kept) == len(source_set.pods):
        return source_set
    return SourceSet(source_set.source, tuple(kept), tuple(errors), source_set.notes)


class FirstSeen:
    """Remembers when each UID was first read (RFC 3339, wall clock), so relists within one
    process keep ``kubernetes.io/config.seen`` stable. ``forget_except`` bounds the memory."""

    def __init__(self, wall: Callable[[], float]) -> None:
        self._wall = wall
        self._seen: dict[str, str] = {}

    def __call__(self, uid: str) -> str:
        if uid not in self._seen:
            self._seen[uid] = rfc3339(self._wall())
        return self._seen[uid]

    def forget_except(self, uids: Iterable[str]) -> None:
        keep = set(uids)
        self._seen = {uid: ts for uid, ts in self._seen.items() if uid in keep}
