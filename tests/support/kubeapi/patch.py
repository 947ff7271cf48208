"""JSON merge patch (RFC 7386) and Kubernetes strategic merge patch, for the stand-in API server.

Strategic merge follows k8s.io/apimachinery/pkg/util/strategicpatch for the fields podvisor's
resources use: lists with a ``patchMergeKey`` are merged element by element on that key (the
table below is read from the ``patchStrategy``/``patchMergeKey`` tags of k8s.io/api core/v1 and
meta/v1), other lists are replaced; ``null`` deletes a key; directives ``$patch: delete|replace``
(in maps and list elements), ``$deleteFromPrimitiveList/<f>``, ``$setElementOrder/<f>`` and
``$retainKeys`` are honoured. Primitive lists with strategy ``merge`` (``finalizers``) are unions.
"""

from __future__ import annotations

import copy
from typing import Any

# field name -> merge key (patchStrategy "merge" with patchMergeKey) in Pod, Node, Lease, meta.
# (PodStatus' containerStatuses, initContainerStatuses and ephemeralContainerStatuses have none:
# atomic lists, replaced whole by a strategic merge patch as by a merge patch.)
MERGE_KEYS: dict[str, str] = {
    "conditions": "type",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "addresses": "type",
    "podIPs": "ip",
    "hostIPs": "ip",
    "taints": "key",
    "hostAliases": "ip",
    "resourceClaims": "name",
    "topologySpreadConstraints": "topologyKey",
}
# primitive lists whose strategy is "merge" (set union)
MERGE_PRIMITIVES = {"finalizers"}


class PatchError(ValueError):
    """The patch cannot be applied (the API answers 422 / 400)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        raise PatchError("a strategic merge patch must be a JSON object")
    return _merge_map(target if isinstance(target, dict) else {}, patch)


def _merge_map(original: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return {}
    if directive is not None:
        raise PatchError(f"unknown patch type: {directive!r}")
    result = copy.deepcopy(original)
    retain = patch.get("$retainKeys")
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key in ("$retainKeys",):
            continue
        if key.startswith("$setElementOrder/"):
            orders[key.split("/", 1)[1]] = value
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list):
                result[field] = [x for x in result[field] if x not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            current = result.get(key)
            result[key] = _merge_map(current if isinstance(current, dict) else {}, value)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = copy.deepcopy(value)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    for field, order in orders.items():
        result[field] = _reorder(field, result.get(field), order)
    return result


def _merge_list(field: str, original: Any, patch: list[Any]) -> list[Any]:
    current = original if isinstance(original, list) else []
    if field in MERGE_PRIMITIVES:
        out = list(current)
        out.extend(x for x in patch if x not in out)
        return out
    key = MERGE_KEYS.get(field)
    if key is None:
        return copy.deepcopy(patch)
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [copy.deepcopy({k: v for k, v in p.items() if k != "$patch"})
                for p in patch if not (isinstance(p, dict) and set(p) == {"$patch"})]
    out = [copy.deepcopy(x) for x in current]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise PatchError(f"{field}: every element must be an object with {key!r}")
        index = next((i for i, x in enumerate(out)
                      if isinstance(x, dict) and x.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                out.pop(index)
            continue
        if index is None:
            out.append(_merge_map({}, item))
        else:
            out[index] = _merge_map(out[index], item)
    return out


def _reorder(field: str, items: Any, order: list[Any]) -> Any:
    if not isinstance(items, list):
        return items
    key = MERGE_KEYS.get(field)

    def ident(x: Any) -> Any:
        return x.get(key) if key and isinstance(x, dict) else x

    wanted = [ident(o) for o in order]
    ranked = sorted(items, key=lambda x: wanted.index(ident(x)) if ident(x) in wanted
                    else len(wanted))
    return ranked
