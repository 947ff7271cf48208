"""Runtime checks of message fields against their declared types (no I/O, no msgpack).

Only the shapes msgpack can carry are supported: ``str``, ``int``, ``float``, ``bool``, ``bytes``,
``None``, ``Any``, ``list[X]``, ``dict[str, X]`` and unions of those (``X | None``).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]


def _check_for(tp: Any) -> Check:
    if tp is Any:
        return lambda _v: True
    if tp is type(None) or tp is None:
        return lambda v: v is None
    if tp is bool:
        return lambda v: isinstance(v, bool)
    if tp is int:
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    if tp is float:
        return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    if tp in (str, bytes):
        return lambda v: isinstance(v, tp)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        checks = [_check_for(a) for a in args]
        return lambda v: any(c(v) for c in checks)
    if origin is list:
        if not args or args[0] is Any:
            return lambda v: isinstance(v, list)
        item = _check_for(args[0])
        return lambda v: isinstance(v, list) and all(item(x) for x in v)
    if origin is dict:
        # Keys are str or bytes already: the codec unpacks with strict_map_key.
        if len(args) < 2 or args[1] is Any:
            return lambda v: isinstance(v, dict)
        val = _check_for(args[1])
        return lambda v: isinstance(v, dict) and all(val(x) for x in v.values())
    raise TypeError(f"unsupported message field type {tp!r}")


def field_checks(cls: type) -> dict[str, Check | None]:
    """One check per declared dataclass field of ``cls``; None for ``Any`` (nothing to check)."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    return {name: None if hints[name] is Any else _check_for(hints[name]) for name in names}
