"""The one place bus messages meet msgpack.

Wire form: ONE frame, ``topic NUL packed``, where ``packed`` is the msgpack array
``[type, version, source process, per-publisher sequence, monotonic timestamp, fields]`` and
``fields`` the message's field values in declaration order. ZeroMQ's SUB filter matches the topic
as the frame's prefix. One frame and one unpack per message keep the bus within reach of raw
pyzmq (bench/bus.py). Anything that does not decode to a declared message of a supported version
with well-typed fields raises ``DecodeError`` naming the reason, so receivers can drop and count
it (a stray multi-part message arrives as several frames, each dropped). Never pickle.
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
REASONS = ("oversize", "frames", "malformed", "unknown_type", "version", "fields")


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
    checks: tuple[tuple[int, str, Check], ...]  # fields typed ``Any`` need no check
    required: int  # fields without a default
    head: tuple[str, int]  # (TYPE, VERSION)
    topic: bytes


def _schema(cls: type[Message]) -> _Schema:
    fields = dataclasses.fields(cls)
    checks = field_checks(cls)
    required = sum(
        1 for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    return _Schema(
        names=tuple(f.name for f in fields),
        checks=tuple((i, f.name, check) for i, f in enumerate(fields)
                     if (check := checks[f.name]) is not None),
        required=required,
        head=(cls.TYPE, cls.VERSION),
        topic=cls.TOPIC.encode(),
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
        schema = self._schemas.get(type(msg))
        if schema is None:
            raise TypeError(f"{type(msg).__name__} is not a declared bus message")
        # A frozen dataclass keeps exactly its fields, in declaration order, in __dict__.
        packed = self._packer.pack(
            (*schema.head, source, seq, ts, tuple(msg.__dict__.values())))
        return [(topic.encode() if topic else schema.topic) + b"\0" + packed]

    def decode(self, frames: Sequence[Any]) -> Envelope:
        """Decode one received frame (bytes or a zmq Frame, in a sequence). Raises
        ``DecodeError``."""
        size = sum(len(f) for f in frames)
        if size > self.max_bytes:
            raise DecodeError("oversize", f"{size} bytes > {self.max_bytes}")
        if len(frames) != 1:
            raise DecodeError("frames", f"expected 1 frame, got {len(frames)}")
        data = frames[0] if type(frames[0]) is bytes else bytes(frames[0].buffer)
        cut = data.find(b"\0")
        if cut < 0:
            raise DecodeError("malformed", "no topic separator")
        try:
            topic = data[:cut].decode()
        except UnicodeDecodeError as e:
            raise DecodeError("malformed", "topic is not utf-8") from e
        try:
            value = msgpack.unpackb(memoryview(data)[cut + 1:], raw=False, strict_map_key=True,
                                    use_list=True)
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
        return Envelope(cls.TYPE, src, seq, float(ts), topic, self._build(cls, fields))

    def _build(self, cls: type[Message], fields: list[Any]) -> Message:
        schema = self._schemas[cls]
        n = len(fields)
        if not schema.required <= n <= len(schema.names):
            raise DecodeError("fields", f"{cls.TYPE}: {n} fields")
        for i, name, check in schema.checks:
            if i < n and not check(fields[i]):
                raise DecodeError("fields", f"{cls.TYPE}.{name}: wrong type")
        if n < len(schema.names):
            return cls(*fields)  # let the dataclass fill in the defaults
        # Every field is present and checked: skip the frozen __init__'s per-field setattr.
        msg = object.__new__(cls)
        msg.__dict__.update(zip(schema.names, fields, strict=True))
        return msg
