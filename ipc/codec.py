"""The one place bus messages meet msgpack.

Wire form: two frames ``[topic, packed]`` where ``packed`` is the msgpack array
``[type, version, source process, per-publisher sequence, monotonic timestamp, fields]`` and
``fields`` is the array of the message's field values in declaration order (one unpack per
message keeps the bus within reach of raw pyzmq; see bench/bus.py). Anything that does not decode
to a declared message of a supported version with well-typed fields raises ``DecodeError`` naming
the reason, so receivers can drop and count it. Never pickle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack

from podvisor.ipc.messages import Message
from podvisor.ipc.schema import Check, field_checks

DEFAULT_MAX_BYTES = 16 * 1024 * 1024

# Drop reasons, used as metric labels.
REASONS = ("frames", "oversize", "malformed", "unknown_type", "version", "fields")


class DecodeError(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class Envelope(NamedTuple):
    """A decoded message with its header. (A NamedTuple: built for every message received.)"""

    type: str
    source: str
    seq: int
    ts: float
    topic: str
    message: Message


def _all_message_types() -> dict[str, type[Message]]:
    found: dict[str, type[Message]] = {}
    pending: list[type[Message]] = list(Message.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if not cls.TYPE:
            continue
        if cls.TYPE in found and found[cls.TYPE] is not cls:
            raise TypeError(f"message type {cls.TYPE!r} declared twice")
        found[cls.TYPE] = cls
    return found


@dataclass(frozen=True)
class _Schema:
    names: tuple[str, ...]
    checks: tuple[tuple[str, Check | None], ...]  # None: Any, nothing to check
    required: int  # fields without a default


def _schema(cls: type[Message]) -> _Schema:
    fields = dataclasses.fields(cls)
    checks = field_checks(cls)
    required = sum(
        1 for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    return _Schema(
        names=tuple(f.name for f in fields),
        checks=tuple((f.name, checks[f.name]) for f in fields),
        required=required,
    )


class Codec:
    """Encodes and decodes envelopes. Immutable after construction; safe to share across threads
    except ``encode``, which reuses one msgpack Packer (one Codec per publishing thread)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._types = _all_message_types()
        self._schemas = {cls: _schema(cls) for cls in self._types.values()}
        self._packer = msgpack.Packer(use_bin_type=True)

    def encode(
        self, msg: Message, source: str, seq: int, ts: float, topic: str | None = None
    ) -> list[bytes]:
        cls = type(msg)
        schema = self._schemas.get(cls)
        if schema is None or self._types.get(cls.TYPE) is not cls:
            raise TypeError(f"{cls.__name__} is not a declared bus message")
        fields = [getattr(msg, n) for n in schema.names]
        packed = self._packer.pack([cls.TYPE, cls.VERSION, source, seq, ts, fields])
        return [(topic or cls.TOPIC).encode(), packed]

    def decode(self, frames: Sequence[Any]) -> Envelope:
        """Decode ``[topic, packed]`` (bytes or zmq Frames). Raises ``DecodeError``."""
        if len(frames) != 2:
            raise DecodeError("frames", f"expected 2 frames, got {len(frames)}")
        raw = [f.buffer if hasattr(f, "buffer") else f for f in frames]
        size = len(raw[0]) + len(raw[1])
        if size > self.max_bytes:
            raise DecodeError("oversize", f"{size} bytes > {self.max_bytes}")
        try:
            value = msgpack.unpackb(raw[1], raw=False, strict_map_key=True, use_list=True)
        except Exception as e:  # msgpack raises several unrelated types on garbage
            raise DecodeError("malformed", type(e).__name__) from e
        if not isinstance(value, list) or len(value) != 6:
            raise DecodeError("malformed", "not a 6-item envelope")
        type_, version, src, seq, ts, fields = value
        cls = self._types.get(type_) if isinstance(type_, str) else None
        if cls is None:
            raise DecodeError("unknown_type", repr(type_)[:80])
        if version != cls.VERSION:
            raise DecodeError("version", f"{cls.TYPE} v{version!r}")
        if not (isinstance(src, str) and isinstance(seq, int) and isinstance(ts, (int, float))
                and isinstance(fields, list)):
            raise DecodeError("malformed", "bad envelope fields")
        msg = self._build(cls, fields)
        try:
            topic = bytes(raw[0]).decode()
        except UnicodeDecodeError as e:
            raise DecodeError("malformed", "topic is not utf-8") from e
        return Envelope(cls.TYPE, src, seq, float(ts), topic, msg)

    def _build(self, cls: type[Message], fields: list[Any]) -> Message:
        schema = self._schemas[cls]
        if not schema.required <= len(fields) <= len(schema.checks):
            raise DecodeError("fields", f"{cls.TYPE}: {len(fields)} fields")
        for (name, check), value in zip(schema.checks, fields, strict=False):
            if check is not None and not check(value):
                raise DecodeError("fields", f"{cls.TYPE}.{name}: wrong type")
        return cls(*fields)
