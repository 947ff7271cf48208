"""Builders of ``pleg`` map values for tests: records written the short way (the wire form's
dicts, without ``v``/``kind``) become the declared types (``podvisor.ipc.maps``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podvisor.ipc.maps import HEALTH_KEY, PlegHealth, PlegPod, PlegValue


def pleg_pod(record: Mapping[str, Any] | None = None, **fields: Any) -> PlegPod:
    """A ``PlegPod`` from a record dict (``{"ts", "name", "sandboxes": [...], ...}``) and/or
    its fields; absent fields take their defaults."""
    return PlegPod.from_wire({"v": 1, "kind": "pod", **(record or {}), **fields})


def pleg_health(**fields: Any) -> PlegHealth:
    return PlegHealth.from_wire({"v": 1, "kind": "health", **fields})


def pleg_map(entries: Mapping[str, Mapping[str, Any]]) -> dict[str, PlegValue]:
    """A ``pleg`` map's content from dicts: ``_health`` a ``PlegHealth``, the rest pods."""
    return {key: pleg_health(**value) if key == HEALTH_KEY else pleg_pod(value)
            for key, value in entries.items()}
