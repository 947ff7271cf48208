"""What both static pod sources share: the result type, pod building, first-seen times."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from podvisor.ipc.maps import PodSetValue
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
    """One rejected input: ``location`` is the file path or URL, ``field`` may be empty.
    ``uid``/``name``/``namespace``: the pod it is, when the source knows it (an API pod): the
    sync loop then refuses that pod the way the kubelet rejects one (a Failed status and an
    Event), or, for a pod it runs, refuses the update and keeps it running."""

    location: str
    field: str
    reason: str
    uid: str = ""
    name: str = ""
    namespace: str = ""

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
    # ``pods[i].to_dict()`` when the reader already has them (a relist reuses unchanged pods'
    # wire forms instead of rendering 100 pods again); never mutated.
    wire: tuple[dict[str, Any], ...] = field(default=(), compare=False, repr=False)

    def wire_pods(self) -> list[dict[str, Any]]:
        if len(self.wire) == len(self.pods):
            return list(self.wire)
        return [p.to_dict() for p in self.pods]

    def to_value(self, ts: float) -> PodSetValue:
        """The ``pods-<source>`` map's value for this read."""
        key = "file" if self.source == "file" else "url"
        return PodSetValue(source=self.source, pods=self.wire_pods(),
                           errors=[_error(key, e) for e in self.errors], ts=ts)


def _error(key: str, e: SourceError) -> dict[str, Any]:
    out: dict[str, Any] = {key: e.location, "field": e.field, "reason": e.reason}
    if e.uid:
        out.update(uid=e.uid, name=e.name, namespace=e.namespace)
    return out


def errors_of(exc: PodValidationError) -> list[SourceError]:
    return [SourceError(exc.where, issue.field, issue.reason) for issue in exc.errors]


@dataclass(frozen=True)
class BuiltPod:
    """A static pod with its wire form (``pod.to_dict()``), that form's canonical JSON size,
    and the first-seen time it was stamped with."""

    pod: Pod
    wire: dict[str, Any]
    size: int
    seen: str


def build_static_pod(parsed: ParsedPod, *, node_name: str, source: str, location: str,
                     seen: Seen) -> Pod:
    """Static defaults + first-seen time + size check. Raises ``PodValidationError``."""
    return build_static(parsed, node_name=node_name, source=source, location=location,
                        seen=seen).pod


def build_static(parsed: ParsedPod, *, node_name: str, source: str, location: str,
                 seen: Seen) -> BuiltPod:
    """``build_static_pod``, keeping the wire form and size it computed."""
    warnings = tuple(str(w) for w in parsed.warnings)
    pod = apply_static_defaults(parsed.pod, node_name=node_name, source=source,
                                location=location, seen="", warnings=warnings)
    first_seen = seen(pod.uid)
    pod = pod.with_annotations({CONFIG_SEEN_ANNOTATION: first_seen})
    wire = pod.to_dict()
    size = len(canonical_json(wire))
    if size > MAX_POD_BYTES:
        raise PodValidationError(location, [FieldIssue(
            "", f"pod is larger than {MAX_POD_BYTES // 1024} KiB once decoded")])
    return BuiltPod(pod, wire, size, first_seen)


def within_budget(source_set: SourceSet, sizes: Sequence[int] = ()) -> SourceSet:
    """Drop the pods past ``MAX_SET_BYTES`` (reported as errors) so the set fits one message.
    ``sizes``: each pod's canonical JSON size when known (else computed)."""
    known = len(sizes) == len(source_set.pods)
    wire = len(source_set.wire) == len(source_set.pods)
    total = 0
    kept: list[int] = []
    errors = list(source_set.errors)
    for i, pod in enumerate(source_set.pods):
        total += sizes[i] if known else len(canonical_json(
            source_set.wire[i] if wire else pod.to_dict()))
        if total > MAX_SET_BYTES:
            location = pod.origin.location if pod.origin else pod.name
            errors.append(SourceError(location, "", "the source's pods together exceed "
                                      f"{MAX_SET_BYTES // (1024 * 1024)} MiB; pod left out"))
        else:
            kept.append(i)
    if len(kept) == len(source_set.pods):
        return source_set
    return SourceSet(source_set.source, tuple(source_set.pods[i] for i in kept), tuple(errors),
                     source_set.notes,
                     tuple(source_set.wire[i] for i in kept) if wire else ())


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
