"""``ApiMeta``: the ``metadata`` of an API object (raw JSON from the API server), typed.

What the API-facing processes read of an object they hold as JSON (a pod from a list or a
watch, a Node, a ConfigMap): read once, with types checked, instead of walking the dict.
Anything missing or of the wrong type reads as empty, the way the API server's absent fields
do (a list item has no ``resourceVersion`` of its own only if the server sends none).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ApiMeta", "node_addresses"]


def _text(meta: Mapping[str, Any], key: str) -> str:
    value = meta.get(key)
    return "" if value is None else str(value)


def _strings(meta: Mapping[str, Any], key: str) -> Mapping[str, str]:
    value = meta.get(key)
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}


@dataclass(frozen=True)
class ApiMeta:
    """``name``, ``namespace``, ``uid``, ``resource_version``, ``creation_timestamp``,
    ``deletion_timestamp`` ("" when unset), ``labels`` and ``annotations``."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    creation_timestamp: str = ""
    deletion_timestamp: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ApiMeta:
        """The metadata of ``obj`` (an API object, or a list: its ``resourceVersion``)."""
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping):
            return cls()
        return cls(_text(meta, "name"), _text(meta, "namespace"), _text(meta, "uid"),
                   _text(meta, "resourceVersion"), _text(meta, "creationTimestamp"),
                   _text(meta, "deletionTimestamp"), _strings(meta, "labels"),
                   _strings(meta, "annotations"))


def node_addresses(node: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A Node's ``status.addresses`` as (type, address) pairs, in the API's order; anything
    missing or of the wrong type reads as none."""
    status = node.get("status")
    listed = status.get("addresses") if isinstance(status, Mapping) else None
    if not isinstance(listed, list):
        return []
    return [(str(a.get("type") or ""), str(a.get("address") or ""))
            for a in listed if isinstance(a, Mapping)]
