"""The Node's allocatable as the kubelet computes it, and quantities in the API's canonical form
(issue 26; pure functions).

kubelet ``cm.GetNodeAllocatableReservation`` + ``nodestatus.MachineInfo``: for every resource of
the capacity, the reservation is ``systemReserved + kubeReserved + hard eviction threshold``
(``memory.available`` reserves memory, ``nodefs.available`` ephemeral-storage; a percentage is
of the capacity, parsed as a float32 as ``ParsePercentage`` does and truncated to whole bytes);
allocatable = capacity - reservation, never below 0. Quantities keep the capacity's format
(``DecimalSI`` for cpu and pods, ``BinarySI`` for memory and ephemeral-storage) and print as
``resource.Quantity.String()`` does: ``1900m``, ``8092Mi``, ``5000000000``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal
from typing import Literal

from podvisor.common import quantity

__all__ = ["BINARY", "DECIMAL", "Capacity", "allocatable", "format_quantity", "reservation"]

Format = Literal["DecimalSI", "BinarySI"]
DECIMAL: Format = "DecimalSI"
BINARY: Format = "BinarySI"
FORMATS: dict[str, Format] = {"cpu": DECIMAL, "pods": DECIMAL, "memory": BINARY,
                              "ephemeral-storage": BINARY}
EVICTION_RESOURCE = {"memory.available": "memory", "nodefs.available": "ephemeral-storage"}
Capacity = Mapping[str, Decimal]

_DECIMAL_SUFFIX = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P",
                   18: "E"}
_BINARY_SUFFIX = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def _format_decimal(value: Decimal) -> str:
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    value = abs(value)
    for exponent in (18, 15, 12, 9, 6, 3, 0, -3, -6, -9):
        mantissa = value.scaleb(-exponent)
        if mantissa == mantissa.to_integral_value():
            return f"{sign}{int(mantissa)}{_DECIMAL_SUFFIX[exponent]}"
    # finer than nano: the API rounds up to nano
    nanos = int(value.scaleb(9).to_integral_value(rounding=ROUND_CEILING))
    return f"{sign}{nanos}n"


def format_quantity(value: Decimal, fmt: Format) -> str:
    """``resource.Quantity.String()`` of ``value`` (base units) in format ``fmt``."""
    if fmt == BINARY and abs(value) >= 1024 and value == value.to_integral_value():
        number = int(value)
        sign = "-" if number < 0 else ""
        number = abs(number)
        power = 0
        while power < len(_BINARY_SUFFIX) - 1 and number % 1024 == 0:
            number //= 1024
            power += 1
        return f"{sign}{number}{_BINARY_SUFFIX[power]}"
    return _format_decimal(value)


def _float32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


def threshold(value: str, capacity: Decimal) -> Decimal:
    """A hard eviction threshold in base units: a quantity, or a percentage of ``capacity``
    (kubelet ``evictionapi.GetThresholdQuantity``)."""
    if value.endswith("%"):
        percent = _float32(_float32(float(value[:-1])) / 100.0)
        return Decimal(int(float(int(capacity)) * percent))
    return quantity.parse_quantity(value)


def reservation(capacity: Capacity, kube_reserved: Mapping[str, str],
                system_reserved: Mapping[str, str],
                eviction_hard: Mapping[str, str]) -> dict[str, Decimal]:
    """What is held back from each resource of ``capacity`` (only the non-zero ones)."""
    eviction: dict[str, Decimal] = {}
    for signal, value in eviction_hard.items():
        resource = EVICTION_RESOURCE.get(signal)
        if resource is not None and resource in capacity:
            eviction[resource] = threshold(value, capacity[resource])
    out: dict[str, Decimal] = {}
    for resource in capacity:
        total = Decimal(0)
        for reserved in (system_reserved, kube_reserved):
            if resource in reserved:
                total += quantity.parse_quantity(reserved[resource])
        total += eviction.get(resource, Decimal(0))
        if total:
            out[resource] = total
    return out


def allocatable(capacity: Capacity, kube_reserved: Mapping[str, str],
                system_reserved: Mapping[str, str],
                eviction_hard: Mapping[str, str]) -> dict[str, Decimal]:
    """Capacity less the reservation, per resource, never negative."""
    held = reservation(capacity, kube_reserved, system_reserved, eviction_hard)
    return {k: max(v - held.get(k, Decimal(0)), Decimal(0)) for k, v in capacity.items()}


def formatted(values: Mapping[str, Decimal]) -> dict[str, str]:
    """Each resource in its API form (``FORMATS``; an unknown one as DecimalSI)."""
    return {k: format_quantity(v, FORMATS.get(k, DECIMAL)) for k, v in values.items()}
