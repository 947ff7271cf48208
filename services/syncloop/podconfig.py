"""PodConfig: merge the full pod sets of every source into ordered updates (kubelet
``pkg/kubelet/config/config.go``, ``podStorage.merge`` in SET mode). Pure: no I/O, no clock.

Per source the state is ``uid -> Pod``. ``apply(source, pods)`` takes that source's FULL set and
returns the updates, in the kubelet's order: REMOVE (UIDs now absent), ADD (new UIDs), UPDATE
(spec, labels, deletion timestamp/grace or non-``kubernetes.io/config.*`` annotations changed),
DELETE (as UPDATE but the pod carries a deletion timestamp), then RECONCILE (only the status
changed). The first set of a source that changes nothing else yields an empty ADD, so the
caller learns that the source is ready.

Duplicates inside one set (same ``<name>_<namespace>`` or same UID): the first in order wins;
the order is the set's, made stable by the pods' origin (file name, then list position). The
losers are not applied and are listed by ``duplicates(source)``.

Thread-safety: none; one owner (the sync loop) calls it from one thread.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Protocol

from podvisor.services.pod import (
    CONFIG_MIRROR_ANNOTATION,
    CONFIG_SEEN_ANNOTATION,
    CONFIG_SOURCE_ANNOTATION,
    LOCAL_ANNOTATION_PREFIX,
    Pod,
)

# The kubelet keeps these from the pod it already has when a pod is updated.
_KEPT_ANNOTATIONS = (CONFIG_SOURCE_ANNOTATION, CONFIG_MIRROR_ANNOTATION, CONFIG_SEEN_ANNOTATION)


class PodOp(StrEnum):
    ADD = "ADD"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    REMOVE = "REMOVE"
    RECONCILE = "RECONCILE"


@dataclass(frozen=True)
class PodUpdate:
    op: PodOp
    source: str
    pods: tuple[Pod, ...]


@dataclass(frozen=True)
class DuplicatePod:
    """A pod that was not applied because an earlier pod in the set had its name or UID."""

    source: str
    full_name: str
    uid: str
    location: str
    kept_location: str
    reason: str


class PodConfig(Protocol):
    def apply(self, source: str, pods: Sequence[Pod],
              keep: Collection[str] = ()) -> list[PodUpdate]:
        """Replace ``source``'s set with ``pods``; return the resulting updates in order.
        ``keep``: UIDs the source refused this time (a pod it could not validate): one this
        source had stays as it was, with no update (an update podvisor cannot honour never
        stops a running pod)."""
        ...

    def sources_ready(self) -> bool:
        """True once every configured source has sent at least one set."""
        ...

    def seen_sources(self) -> frozenset[str]:
        ...

    def pods(self) -> list[Pod]:
        """Every pod currently wanted, all sources together (source order, then set order)."""
        ...

    def duplicates(self, source: str) -> tuple[DuplicatePod, ...]:
        """The pods left out of ``source``'s latest set as duplicates."""
        ...


def new_pod_config(sources: Iterable[str]) -> PodConfig:
    """A PodConfig that is ready once each of ``sources`` (e.g. {"file", "http"}) has sent."""
    return _PodConfig(frozenset(sources))


class _PodConfig:
    def __init__(self, sources: frozenset[str]) -> None:
        self._configured = sources
        self._seen: set[str] = set()
        self._state: dict[str, dict[str, Pod]] = {}
        self._duplicates: dict[str, tuple[DuplicatePod, ...]] = {}

    def apply(self, source: str, pods: Sequence[Pod],
              keep: Collection[str] = ()) -> list[PodUpdate]:
        first = source not in self._seen
        self._seen.add(source)
        old = self._state.get(source, {})
        kept, self._duplicates[source] = _filter_duplicates(source, pods)
        new: dict[str, Pod] = {uid: old[uid] for uid in keep if uid in old}
        ops: dict[PodOp, list[Pod]] = {op: [] for op in PodOp}
        for ref in kept:
            ref = ref.with_annotations({CONFIG_SOURCE_ANNOTATION: source})
            existing = old.get(ref.uid)
            if existing is None:
                new[ref.uid] = ref
                ops[PodOp.ADD].append(ref)
                continue
            merged, op = _check_and_update(existing, ref)
            new[ref.uid] = merged
            if op is not None:
                ops[op].append(merged)
        ops[PodOp.REMOVE] = [pod for uid, pod in old.items() if uid not in new]
        self._state[source] = new
        return _ordered(source, ops, first)

    def sources_ready(self) -> bool:
        return self._configured <= self._seen

    def seen_sources(self) -> frozenset[str]:
        return frozenset(self._seen)

    def pods(self) -> list[Pod]:
        return [pod for source in sorted(self._state) for pod in self._state[source].values()]

    def duplicates(self, source: str) -> tuple[DuplicatePod, ...]:
        return self._duplicates.get(source, ())


def _ordered(source: str, ops: Mapping[PodOp, list[Pod]], first: bool) -> list[PodUpdate]:
    out = [PodUpdate(op, source, tuple(ops[op]))
           for op in (PodOp.REMOVE, PodOp.ADD, PodOp.UPDATE, PodOp.DELETE) if ops[op]]
    if first and not (ops[PodOp.ADD] or ops[PodOp.UPDATE] or ops[PodOp.DELETE]):
        out.append(PodUpdate(PodOp.ADD, source, ()))
    if ops[PodOp.RECONCILE]:
        out.append(PodUpdate(PodOp.RECONCILE, source, tuple(ops[PodOp.RECONCILE])))
    return out


def _location(pod: Pod) -> str:
    return pod.origin.location if pod.origin is not None else ""


def _filter_duplicates(source: str, pods: Sequence[Pod]) -> tuple[list[Pod],
                                                                   tuple[DuplicatePod, ...]]:
    by_name: dict[str, Pod] = {}
    by_uid: dict[str, Pod] = {}
    kept: list[Pod] = []
    dups: list[DuplicatePod] = []
    for pod in sorted(pods, key=_location):
        winner = by_name.get(pod.full_name) or by_uid.get(pod.uid)
        if winner is not None:
            what = "name" if winner.full_name == pod.full_name else "UID"
            dups.append(DuplicatePod(
                source=source, full_name=pod.full_name, uid=pod.uid, location=_location(pod),
                kept_location=_location(winner),
                reason=f"duplicate pod {what} {pod.full_name if what == 'name' else pod.uid!r}"
                       f" (already defined by {_location(winner) or 'an earlier pod'}); ignored"))
            continue
        by_name[pod.full_name] = by_uid[pod.uid] = pod
        kept.append(pod)
    return kept, tuple(dups)


def _user_annotations(annotations: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in annotations.items() if not k.startswith(LOCAL_ANNOTATION_PREFIX)}


def _differ(existing: Pod, ref: Pod) -> bool:
    """The kubelet's ``podsDifferSemantically``."""
    a, b = existing.metadata, ref.metadata
    return (existing.spec != ref.spec or dict(a.labels) != dict(b.labels)
            or a.deletion_timestamp != b.deletion_timestamp
            or a.deletion_grace_period_seconds != b.deletion_grace_period_seconds
            or _user_annotations(a.annotations) != _user_annotations(b.annotations))


def _check_and_update(existing: Pod, ref: Pod) -> tuple[Pod, PodOp | None]:
    """The kubelet's ``checkAndUpdatePod``: the pod to keep and what happened to it."""
    if not _differ(existing, ref):
        if dict(existing.status) != dict(ref.status):
            return replace(existing, status=ref.status), PodOp.RECONCILE
        return existing, None
    annotations = dict(ref.metadata.annotations)
    for key in _KEPT_ANNOTATIONS:
        if key in existing.metadata.annotations:
            annotations[key] = existing.metadata.annotations[key]
    metadata = replace(existing.metadata, labels=ref.metadata.labels, annotations=annotations,
                       deletion_timestamp=ref.metadata.deletion_timestamp,
                       deletion_grace_period_seconds=ref.metadata.deletion_grace_period_seconds)
    merged = replace(existing, metadata=metadata, spec=ref.spec, status=ref.status,
                     origin=ref.origin)
    return merged, PodOp.DELETE if ref.metadata.deletion_timestamp else PodOp.UPDATE
