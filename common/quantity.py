"""Kubernetes resource quantities ("100m", "128Mi", "1.5", 2) parsed to integers.

CPU becomes millicores and memory becomes bytes, both rounded up as the API server's
``Quantity.MilliValue()`` / ``Value()`` do. Pure functions, no state.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

_QUANTITY = re.compile(r"^([+-]?[0-9]*\.?[0-9]+|[+-]?[0-9]+\.)([eE][+-]?[0-9]+|[a-zA-Z]*)$")

_SUFFIX: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}

# Anything past this is a typo, not a real machine (and keeps ints msgpack-able).
_MAX = Decimal(2**62)


class QuantityError(ValueError):
    """Raised with a short reason when a quantity cannot be parsed."""


def parse_quantity(value: object) -> Decimal:
    """Parse a quantity (string, int or float) into an exact non-negative Decimal."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise QuantityError("must be a quantity such as '500m', '2' or '128Mi'")
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if match is None:
        raise QuantityError(f"{text!r} is not a valid quantity")
    number, suffix = match.groups()
    try:
        amount = Decimal(number)
        if suffix[:1] in ("e", "E") and suffix not in _SUFFIX:  # "1E" is exa, "1e3" 1000
            amount = amount.scaleb(int(suffix[1:]))
        elif suffix in _SUFFIX:
            amount = amount * _SUFFIX[suffix]
        else:
            raise QuantityError(f"{text!r} has an unknown suffix {suffix!r}")
    except InvalidOperation as exc:
        raise QuantityError(f"{text!r} is not a valid quantity") from exc
    if amount < 0:
        raise QuantityError(f"{text!r} must not be negative")
    if amount > _MAX:
        raise QuantityError(f"{text!r} is too large")
    return amount


def cpu_millis(value: object) -> int:
    """CPU quantity to millicores, rounded up ("100m" -> 100, "1.5" -> 1500, 2 -> 2000)."""
    amount = parse_quantity(value) * 1000
    return int(amount.to_integral_value(rounding=ROUND_CEILING))


def memory_bytes(value: object) -> int:
    """Memory quantity to bytes, rounded up ("128Mi" -> 134217728, "1G" -> 10**9)."""
    amount = parse_quantity(value)
    return int(amount.to_integral_value(rounding=ROUND_CEILING))


def format_cpu(millis: int) -> str:
    """Canonical wire form of a CPU amount: whole cores as "2", otherwise "1500m"."""
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def format_memory(amount: int) -> str:
    """Canonical wire form of a memory amount in bytes, binary-SI as the API server writes a
    quantity given that way: the largest power of 1024 that divides it ("128Mi", "1Gi"),
    else plain bytes."""
    for suffix, power in (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20),
                          ("Ki", 10)):
        if amount and amount % (1 << power) == 0:
            return f"{amount >> power}{suffix}"
    return str(amount)
