"""The checks every map value's ``from_wire`` shares: one error type and typed field readers.

A value that is not a declared type's wire form raises ``MapValueError`` with ``reason``
``version`` (unknown version) or ``fields`` (malformed); a replica drops and counts it
(``MapReplica.value_drops``), as the codec drops a message it cannot read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["MapValueError", "opt_str", "read_bool", "read_float", "read_int", "read_list",
           "read_map", "read_str"]


class MapValueError(ValueError):
    """A map value that is not a declared type's wire form; ``reason`` as the codec's:
    ``version`` (unknown version) or ``fields`` (malformed)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def read_map(raw: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise MapValueError("fields", f"{what}: not a map")
    return raw


def read_str(raw: Mapping[str, Any], key: str, what: str, default: str = "") -> str:
    value = raw.get(key, default)
    if not isinstance(value, str):
        raise MapValueError("fields", f"{what}: {key} not a string")
    return value


def opt_str(raw: Mapping[str, Any], key: str, what: str) -> str | None:
    """A string field that may be absent or null (None)."""
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise MapValueError("fields", f"{what}: {key} not a string")
    return value


def read_bool(raw: Mapping[str, Any], key: str, what: str, default: bool = False) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise MapValueError("fields", f"{what}: {key} not a bool")
    return value


def read_int(raw: Mapping[str, Any], key: str, what: str, default: int = 0) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise MapValueError("fields", f"{what}: {key} not an int")
    return value


def read_float(raw: Mapping[str, Any], key: str, what: str = "value") -> float:
    value = raw.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MapValueError("fields", f"{what}: {key} not a number")
    return float(value)


def read_list(raw: Mapping[str, Any], key: str, what: str) -> list[Any] | tuple[Any, ...]:
    value = raw.get(key)
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise MapValueError("fields", f"{what}: {key} not a list")
    return value
