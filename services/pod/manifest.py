"""Manifest bytes -> one decoded document -> ``ParsedPod`` (JSON or YAML, safe loader only).

YAML is read with pyyaml's safe loader (the libyaml one when available) with one change:
timestamps stay strings, as in Kubernetes' own YAML decoding, so ``deletionTimestamp`` and
``status`` keep their text.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import yaml

from podvisor.services.pod.errors import FieldIssue, PodValidationError
from podvisor.services.pod.parse import ParsedPod, pod_from_dict

MAX_MANIFEST_BYTES = 10 * 1024 * 1024
# Values in a decoded document, counting each use of a YAML alias again: bounds the work done
# on a small file whose aliases expand it a millionfold.
MAX_DOCUMENT_NODES = 500_000

_SafeBase: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TIMESTAMP = "tag:yaml.org,2002:timestamp"


class _Loader(_SafeBase):  # type: ignore[misc]
    """The safe loader without the implicit timestamp resolver."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP]
    for first, resolvers in _SafeBase.yaml_implicit_resolvers.items()
}


def _fail(where: str, reason: str, field: str = "") -> PodValidationError:
    return PodValidationError(where, [FieldIssue(field, reason)])


def load_document(data: bytes, where: str) -> Any:
    """Decode exactly one JSON or YAML document; raise ``PodValidationError`` otherwise."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise _fail(where, f"larger than {MAX_MANIFEST_BYTES // (1024 * 1024)} MiB")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _fail(where, f"not UTF-8 text (byte {exc.start})") from exc
    stripped = text.lstrip()
    if not stripped:
        raise _fail(where, "empty manifest")
    if stripped[0] in "{[":
        try:
            return json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            pass  # maybe YAML flow style; let the YAML parser report
    try:
        docs = [doc for doc in yaml.load_all(text, Loader=_Loader) if doc is not None]
    except (yaml.YAMLError, RecursionError) as exc:
        raise _fail(where, f"invalid YAML: {_one_line(exc)}") from exc
    if not docs:
        raise _fail(where, "empty manifest (no YAML document)")
    if len(docs) > 1:
        raise _fail(where, f"found {len(docs)} YAML documents; put one Pod per file")
    if not _within_nodes(docs[0], MAX_DOCUMENT_NODES):
        raise _fail(where, f"more than {MAX_DOCUMENT_NODES} values once YAML aliases are "
                    "expanded")
    return docs[0]


def _within_nodes(doc: Any, budget: int) -> bool:
    """True if ``doc`` holds at most ``budget`` values (iterative; stops early)."""
    stack = [doc]
    while stack:
        budget -= 1
        if budget < 0:
            return False
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return True


def decode_pod(data: bytes, where: str) -> ParsedPod:
    """One Pod from a manifest file's bytes."""
    return pod_from_dict(load_document(data, where), where)


def decode_pod_or_list(data: bytes, where: str) -> tuple[list[ParsedPod],
                                                         list[PodValidationError]]:
    """A Pod or a PodList (an HTTP source's body). Each list item is validated on its own:
    the valid ones are returned with one error per invalid item (fields ``items[i]...``).
    A body that is neither raises ``PodValidationError``."""
    doc = load_document(data, where)
    if not isinstance(doc, dict) or doc.get("kind") != "PodList":
        return [pod_from_dict(doc, where)], []
    items = doc.get("items")
    if items is None:
        return [], []
    if not isinstance(items, list):
        raise _fail(where, "must be a list", "items")
    pods: list[ParsedPod] = []
    errors: list[PodValidationError] = []
    for i, item in enumerate(items):
        try:
            pods.append(pod_from_dict(item, where))
        except PodValidationError as exc:
            prefixed = [replace(e, field=f"items[{i}].{e.field}" if e.field else f"items[{i}]")
                        for e in exc.errors]
            errors.append(PodValidationError(where, prefixed))
    return pods, errors


def _one_line(exc: BaseException) -> str:
    return re.sub(r"\s+", " ", str(exc).replace('in "<unicode string>", ', "")).strip()
