"""Typed readers over a decoded manifest that record findings instead of raising.

Each reader takes the ``Findings`` collector, the mapping, the key and the field path of the
mapping; a missing key or a null value counts as absent (Kubernetes semantics). On a bad value
the reader records an error and returns the default, so one pass reports every problem.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from podvisor.services.pod.errors import FieldIssue

E = TypeVar("E", bound=StrEnum)


@dataclass(frozen=True)
class Unsupported:
    """What to do with a field podvisor does not support: reject the pod, or warn and ignore."""

    reject: bool
    reason: str


# A hostile manifest could yield millions of findings; past this many, the rest are dropped.
MAX_FINDINGS = 100


@dataclass
class Findings:
    errors: list[FieldIssue] = field(default_factory=list)
    warnings: list[FieldIssue] = field(default_factory=list)
    # API pods may reference API objects (configMap/secret/projected volumes, their env
    # sources); static pods may not (the kubelet rejects them)
    api_objects: bool = False

    def error(self, path: str, reason: str) -> None:
        if len(self.errors) < MAX_FINDINGS:
            self.errors.append(FieldIssue(path, reason))

    def warn(self, path: str, reason: str) -> None:
        if len(self.warnings) < MAX_FINDINGS:
            self.warnings.append(FieldIssue(path, reason))


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def as_map(f: Findings, value: Any, path: str) -> Mapping[str, Any] | None:
    """``value`` as a mapping with string keys, or None (and an error) if it is not one."""
    if not isinstance(value, Mapping):
        f.error(path, f"must be an object, not {_kind(value)}")
        return None
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        f.error(path, f"keys must be strings, found {bad[0]!r}")
        return None
    return value


def check_fields(f: Findings, m: Mapping[str, Any], path: str, known: Collection[str],
                 unsupported: Mapping[str, Unsupported], reject_unknown: str = "") -> None:
    """Report every key of ``m`` that is not in ``known``: by ``unsupported`` when listed,
    else as an unknown field (a warning, or an error with ``reject_unknown`` as the reason)."""
    for key, value in m.items():
        if key in known or value is None:
            continue
        rule = unsupported.get(key)
        where = join(path, key)
        if rule is not None and not rule.reject and value == {}:
            continue  # an empty object sets nothing (e.g. the defaulted securityContext: {})
        if rule is not None:
            (f.error if rule.reject else f.warn)(where, rule.reason)
        elif reject_unknown:
            f.error(where, reject_unknown)
        else:
            f.warn(where, "unknown field, ignored")


def get_str(f: Findings, m: Mapping[str, Any], key: str, path: str, *,
            required: bool = False, default: str = "") -> str:
    value = m.get(key)
    if value is None or (required and value == ""):
        if required:
            f.error(join(path, key), "required")
        return default
    if not isinstance(value, str):
        f.error(join(path, key), f"must be a string, not {_kind(value)}")
        return default
    return value


def get_opt_int(f: Findings, m: Mapping[str, Any], key: str, path: str, *,
                minimum: int | None = None, maximum: int | None = None,
                required: bool = False) -> int | None:
    value = m.get(key)
    where = join(path, key)
    if value is None:
        if required:
            f.error(where, "required")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        f.error(where, f"must be an integer, not {_kind(value)}")
        return None
    if minimum is not None and value < minimum:
        f.error(where, f"must be at least {minimum}, got {value}")
        return None
    if maximum is not None and value > maximum:
        f.error(where, f"must be at most {maximum}, got {value}")
        return None
    return value


def get_int(f: Findings, m: Mapping[str, Any], key: str, path: str, default: int, *,
            minimum: int | None = None, maximum: int | None = None) -> int:
    value = get_opt_int(f, m, key, path, minimum=minimum, maximum=maximum)
    return default if value is None else value


def get_bool(f: Findings, m: Mapping[str, Any], key: str, path: str) -> bool:
    value = m.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        f.error(join(path, key), f"must be true or false, not {_kind(value)}")
        return False
    return value


def get_enum(f: Findings, m: Mapping[str, Any], key: str, path: str, kind: type[E],
             default: E) -> E:
    text = get_str(f, m, key, path)
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        allowed = ", ".join(repr(str(v)) for v in kind if str(v))
        f.error(join(path, key), f"unsupported value {text!r} (allowed: {allowed})")
        return default


def get_list(f: Findings, m: Mapping[str, Any], key: str, path: str) -> list[tuple[str, Any]]:
    """The items of a list field with their paths (``path.key[i]``); [] when absent."""
    value = m.get(key)
    if value is None:
        return []
    where = join(path, key)
    if not isinstance(value, list):
        f.error(where, f"must be a list, not {_kind(value)}")
        return []
    return [(f"{where}[{i}]", item) for i, item in enumerate(value)]


def get_str_list(f: Findings, m: Mapping[str, Any], key: str, path: str) -> tuple[str, ...]:
    out: list[str] = []
    for where, item in get_list(f, m, key, path):
        if isinstance(item, str):
            out.append(item)
        else:
            f.error(where, f"must be a string, not {_kind(item)} (quote numbers in YAML)")
    return tuple(out)


def get_str_map(f: Findings, m: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
    value = m.get(key)
    if value is None:
        return {}
    where = join(path, key)
    mapping = as_map(f, value, where)
    if mapping is None:
        return {}
    out: dict[str, str] = {}
    for k, v in mapping.items():
        if isinstance(v, str):
            out[k] = v
        else:
            f.error(join(where, k), f"must be a string, not {_kind(v)} (quote it in YAML)")
    return out


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__
