"""Decoded manifest (a dict) -> typed, validated, defaulted ``Pod``.

``pod_from_dict`` reads both a user's manifest and the wire form of ``Pod.to_dict()``. Every
problem is collected; if any is an error, one ``PodValidationError`` lists them all. Fields
podvisor does not support are rejected or warned about per ``policy``; warnings come back in
``ParsedPod.warnings`` and, as text, in ``Pod.origin.warnings``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from podvisor.services.pod import names, policy
from podvisor.services.pod.errors import FieldIssue, PodValidationError
from podvisor.services.pod.fields import (
    Findings,
    as_map,
    check_fields,
    get_opt_int,
    get_str,
    get_str_list,
    get_str_map,
    join,
)
from podvisor.services.pod.model import ObjectMeta, Origin, Pod
from podvisor.services.pod.parse_spec import parse_spec

MAX_ANNOTATIONS_BYTES = 256 * 1024
_STATUS_MAX_NODES = 10_000
_STATUS_MAX_DEPTH = 32


@dataclass(frozen=True)
class ParsedPod:
    pod: Pod
    warnings: tuple[FieldIssue, ...] = ()


def pod_from_dict(obj: Any, where: str = "", *, api_objects: bool = False) -> ParsedPod:
    """Validate and default one Pod object. Raises ``PodValidationError`` naming ``where``.
    ``api_objects``: the pod comes from the API server and may reference ConfigMaps, Secrets
    and service account tokens (a wire form whose origin is ``api`` may too)."""
    f = Findings()
    m = as_map(f, obj, "")
    if m is None:
        raise PodValidationError(where, f.errors)
    check_fields(f, m, "", policy.POD_KNOWN, {})
    kind = get_str(f, m, "kind", "", required=True)
    if kind and kind != "Pod":
        f.error("kind", f"expected a Pod, got {kind!r} (podvisor runs Pods only)")
        raise PodValidationError(where, f.errors)
    api_version = get_str(f, m, "apiVersion", "", required=True)
    if api_version and api_version != "v1":
        f.error("apiVersion", f"expected 'v1', got {api_version!r}")
    origin = _parse_origin(f, m.get("podvisor"))
    f.api_objects = api_objects or (origin is not None and origin.source == "api")
    meta = _parse_metadata(f, m.get("metadata"))
    spec = parse_spec(f, m.get("spec"), "spec")
    status = _parse_status(f, m.get("status"))
    if f.errors or meta is None or spec is None:
        raise PodValidationError(where, f.errors or [FieldIssue("", "invalid pod")])
    warnings = tuple(f.warnings)
    if origin is not None and warnings:  # a wire form already lists its own warnings
        new = tuple(w for w in map(str, warnings) if w not in origin.warnings)
        origin = replace(origin, warnings=origin.warnings + new)
    return ParsedPod(Pod(meta, spec, status, origin), warnings)


def _parse_metadata(f: Findings, raw: Any) -> ObjectMeta | None:
    path = "metadata"
    if raw is None:
        f.error(path, "required")
        return None
    m = as_map(f, raw, path)
    if m is None:
        return None
    check_fields(f, m, path, policy.METADATA_KNOWN, policy.METADATA_UNSUPPORTED)
    name = get_str(f, m, "name", path, required=True)
    if name and (reason := names.dns1123_subdomain(name)):
        f.error(join(path, "name"), reason)
    namespace = get_str(f, m, "namespace", path)
    if namespace and (reason := names.dns1123_label(namespace)):
        f.error(join(path, "namespace"), reason)
    labels = get_str_map(f, m, "labels", path)
    for key, value in labels.items():
        if reason := names.qualified_name(key) or names.label_value(value):
            f.error(join(path, f"labels.{key}"), reason)
    annotations = get_str_map(f, m, "annotations", path)
    for key in annotations:
        if reason := names.qualified_name(key):
            f.error(join(path, f"annotations.{key}"), reason)
    if sum(len(k) + len(v) for k, v in annotations.items()) > MAX_ANNOTATIONS_BYTES:
        f.error(join(path, "annotations"), "total size must be at most 256 KiB")
    deletion = get_str(f, m, "deletionTimestamp", path) or None
    if deletion is not None and not _is_rfc3339(deletion):
        f.error(join(path, "deletionTimestamp"), f"{deletion!r} is not an RFC 3339 time")
    return ObjectMeta(
        name=name,
        namespace=namespace,
        uid=get_str(f, m, "uid", path),
        labels=labels,
        annotations=annotations,
        deletion_timestamp=deletion,
        deletion_grace_period_seconds=get_opt_int(f, m, "deletionGracePeriodSeconds", path,
                                                  minimum=0),
    )


def _is_rfc3339(text: str) -> bool:
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return False
    return "T" in text.upper() and parsed.tzinfo is not None


def _parse_status(f: Findings, raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    m = as_map(f, raw, "status")
    if m is None:
        return {}
    budget = [_STATUS_MAX_NODES]
    try:
        return {k: _plain(v, budget, 1) for k, v in m.items()}
    except ValueError as exc:
        f.error("status", str(exc))
        return {}


def _plain(value: Any, budget: list[int], depth: int) -> Any:
    """A deep copy of JSON-like data, bounded in size and depth (YAML aliases can explode)."""
    budget[0] -= 1
    if budget[0] < 0 or depth > _STATUS_MAX_DEPTH:
        raise ValueError("too large or too deeply nested")
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, list):
        return [_plain(v, budget, depth + 1) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _plain(v, budget, depth + 1) for k, v in value.items()}
    raise ValueError(f"must hold only JSON values, found {type(value).__name__}")


def _parse_origin(f: Findings, raw: Any) -> Origin | None:
    if raw is None:
        return None
    m = as_map(f, raw, "podvisor")
    if m is None:
        return None
    check_fields(f, m, "podvisor", ("source", "location", "warnings"), {})
    return Origin(source=get_str(f, m, "source", "podvisor"),
                  location=get_str(f, m, "location", "podvisor"),
                  warnings=get_str_list(f, m, "warnings", "podvisor"))

