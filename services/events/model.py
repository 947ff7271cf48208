"""Building ``Event`` messages, and naming what went wrong with a manifest.

Reasons are short CamelCase codes an operator can grep for, like the kubelet's
(``pkg/kubelet/events``). For manifests podvisor adds specific ones, because a static pod that
failed to parse has no pod to show in ``/pods``:

=====================  =======  ==========================================================
reason                 type     when
=====================  =======  ==========================================================
FileTooLarge           Warning  the file is over 10 MiB (not read) or the pod over 1.5 MiB
FailedParse            Warning  not UTF-8, not YAML/JSON, empty, several documents
WrongKind              Warning  ``kind`` is not ``Pod`` (a Deployment, a Service, ...)
ReferencesAPIObject    Warning  a Secret/ConfigMap/PVC/... that a static pod may not use
FailedRead             Warning  the file could not be read
FailedValidation       Warning  any other invalid field (missing image, bad name, ...)
DuplicatePodName       Warning  a second manifest with the same namespace/name (ignored)
UnsupportedField       Warning  a field podvisor ignores (the pod runs without it)
FailedFetch            Warning  ``staticPodURL`` did not answer with pods
=====================  =======  ==========================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.maps import PlegPod
from podvisor.ipc.messages import Event

NORMAL = "Normal"
WARNING = "Warning"

FILE_TOO_LARGE = "FileTooLarge"
FAILED_PARSE = "FailedParse"
WRONG_KIND = "WrongKind"
REFERENCES_API_OBJECT = "ReferencesAPIObject"
FAILED_READ = "FailedRead"
FAILED_VALIDATION = "FailedValidation"
DUPLICATE_POD_NAME = "DuplicatePodName"
UNSUPPORTED_FIELD = "UnsupportedField"
FAILED_FETCH = "FailedFetch"

_PARSE_MARKS = ("invalid yaml", "not utf-8", "empty manifest", "yaml documents",
                "values once yaml aliases", "must be a mapping", "expected a mapping")


def manifest_error_reason(field: str, reason: str) -> str:
    """The event reason for one rejected manifest finding (``SourceError`` field + reason)."""
    text = reason.lower()
    if "larger than" in text:
        return FILE_TOO_LARGE
    if text.startswith("cannot read"):
        return FAILED_READ
    if field == "kind" and "expected a pod" in text:
        return WRONG_KIND
    if "may not reference api objects" in text:
        return REFERENCES_API_OBJECT
    if not field and any(mark in text for mark in _PARSE_MARKS):
        return FAILED_PARSE
    return FAILED_VALIDATION


def manifest_object(key: str, location: str) -> dict[str, Any]:
    """The involved object of a manifest that produced no pod: ``key`` is "file" or "url"."""
    return {"kind": "Manifest", key: location}


def pod_object(name: str, namespace: str, uid: str, *, field_path: str = "",
               file: str = "") -> dict[str, Any]:
    obj: dict[str, Any] = {"kind": "Pod", "name": name, "namespace": namespace, "uid": uid}
    if field_path:
        obj["fieldPath"] = field_path
    if file:
        obj["file"] = file
    return obj


def new_event(type_: str, reason: str, message: str, obj: Mapping[str, Any], source: str,
              wall: float | None = None) -> Event:
    ts = SYSTEM_CLOCK.wall() if wall is None else wall
    return Event(type=type_, reason=reason, message=message, object=dict(obj), source=source,
                 count=1, first_ts=ts, last_ts=ts)


def container_died(record: PlegPod | None, container_id: str, uid: str,
                   source: str, wall: float) -> Event | None:
    """The ``ContainerDied`` event for a PLEG record (the ``pleg`` map's value), or None
    when the record does not hold that container (a sandbox, or already removed)."""
    c = record.container(container_id) if record is not None else None
    if record is None or c is None:
        return None
    why = f" ({c.reason})" if c.reason else ""
    obj = pod_object(record.name, record.namespace, uid,
                     field_path=f"spec.containers{{{c.name}}}")
    return new_event(NORMAL if c.exit_code == 0 else WARNING, "ContainerDied",
                     f"Container {c.name} exited with code {c.exit_code}{why}", obj, source, wall)
