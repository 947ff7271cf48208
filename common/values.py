"""Parsers for config values: durations, quantities, endpoints, and typed scalars.

Pure functions with no I/O. Each takes the dotted key path (for the error message) and the raw
value as YAML or JSON produced it, and returns the typed value or raises `ConfigError` naming
the key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from podvisor.common import quantity
from podvisor.common.endpoint import EMBEDDED

__all__ = [
    "ConfigError",
    "format_duration",
    "parse_bool",
    "parse_duration",
    "parse_endpoint",
    "parse_float",
    "parse_headers",
    "parse_int",
    "parse_quantity",
    "parse_str",
]


class ConfigError(ValueError):
    """A config key has a bad value, or is unknown. `key` is the dotted path of the key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config key {key!r}: {problem}")
        self.key = key
        self.problem = problem


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_duration(key: str, raw: object) -> float:
    """Parse a Go/Kubernetes duration (`20s`, `1m30s`, `300ms`, `0`) into float seconds.

    Negative durations and bare numbers (other than `0`) are rejected: the unit must be explicit.
    """
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise ConfigError(key, f"expected a duration such as '20s', got {type(raw).__name__}")
    text = str(raw).strip()
    if not text:
        raise ConfigError(key, "empty duration")
    if text == "0":
        return 0.0
    pos = 0
    total = 0.0
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        if match is None:
            raise ConfigError(key, f"bad duration {text!r} (use e.g. '500ms', '20s', '1m')")
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    return total


def format_duration(seconds: float) -> str:
    """Format float seconds so that `parse_duration` reads back the same value."""
    return f"{seconds!r}s"


def parse_int(key: str, raw: object, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer (YAML int, or a decimal string from a flag) within optional bounds."""
    if isinstance(raw, bool):
        raise ConfigError(key, "expected an integer, got a boolean")
    if isinstance(raw, str):
        try:
            raw = int(raw.strip(), 10)
        except ValueError:
            raise ConfigError(key, f"expected an integer, got {raw!r}") from None
    if not isinstance(raw, int):
        raise ConfigError(key, f"expected an integer, got {type(raw).__name__}")
    if minimum is not None and raw < minimum:
        raise ConfigError(key, f"must be >= {minimum}, got {raw}")
    if maximum is not None and raw > maximum:
        raise ConfigError(key, f"must be <= {maximum}, got {raw}")
    return raw


def parse_float(key: str, raw: object, minimum: float = 0.0) -> float:
    """A finite number >= minimum (YAML int/float, or a string from a flag)."""
    if isinstance(raw, bool):
        raise ConfigError(key, "expected a number, got a boolean")
    if isinstance(raw, str):
        try:
            raw = float(raw.strip())
        except ValueError:
            raise ConfigError(key, f"expected a number, got {raw!r}") from None
    if not isinstance(raw, int | float) or not math.isfinite(raw):
        raise ConfigError(key, f"expected a finite number, got {raw!r}")
    if raw < minimum:
        raise ConfigError(key, f"must be >= {minimum}, got {raw}")
    return float(raw)


_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}


def parse_bool(key: str, raw: object) -> bool:
    """A YAML boolean, or `true`/`false` (and yes/no/1/0/on/off) from a flag."""
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
        return raw.strip().lower() in _TRUE
    raise ConfigError(key, f"expected true or false, got {raw!r}")


def parse_str(key: str, raw: object) -> str:
    """A string (YAML scalars that are not strings are rejected, not coerced)."""
    if not isinstance(raw, str):
        raise ConfigError(key, f"expected a string, got {type(raw).__name__}")
    return raw


def parse_quantity(key: str, raw: object) -> int:
    """A Kubernetes size quantity (`10Mi`, `500k`, `1048576`) as an integer count of bytes."""
    if isinstance(raw, bool):
        raise ConfigError(key, "expected a size such as '10Mi', got a boolean")
    if isinstance(raw, int):
        if raw < 0:
            raise ConfigError(key, f"must be >= 0, got {raw}")
        return raw
    if not isinstance(raw, str):
        raise ConfigError(key, f"expected a size such as '10Mi', got {type(raw).__name__}")
    try:  # the one quantity parser (common/quantity.py); a size is a whole number of bytes
        amount = quantity.parse_quantity(raw)
    except quantity.QuantityError:
        amount = None
    if amount is None or amount != amount.to_integral_value():
        raise ConfigError(key, f"bad size {raw!r} (use e.g. '10Mi', '500k', '1048576')")
    return int(amount)


def parse_endpoint(key: str, raw: object) -> str:
    """`embedded` or `unix:///absolute/path` (a CRI runtime's socket)."""
    text = parse_str(key, raw).strip()
    if text == EMBEDDED:
        return text
    if text.startswith("unix:///") and len(text) > len("unix:///"):
        return text
    raise ConfigError(key, f"expected 'embedded' or 'unix:///path/to/cri.sock', got {text!r}")


def parse_headers(key: str, raw: object) -> dict[str, list[str]]:
    """An HTTP header map: name -> list of values (a single string value is accepted too)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(key, f"expected a map of header name to values, got {type(raw).__name__}")
    headers: dict[str, list[str]] = {}
    for name, values in raw.items():
        sub = f"{key}.{name}"
        if not isinstance(name, str) or not name:
            raise ConfigError(sub, "header names must be non-empty strings")
        if isinstance(values, str):
            values = [values]
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ConfigError(sub, "expected a string or a list of strings")
        headers[name] = list(values)
    return headers
