"""The one place bus messages meet msgpack.

Wire form: three frames ``[topic, header, body]``. The header is a msgpack map
``{t: type, v: version, src: source process, seq: per-publisher sequence, ts: monotonic time}``;
the body is the message's fields as a msgpack map. Anything that does not decode to a declared
message of a supported version with well-typed fields raises ``DecodeError`` naming the reason, so
receivers can drop and count it. Never pickle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class Envelope:
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


class Codec:
    """Encodes and decodes envelopes. Immutable after construction; safe to share across threads."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._types = _all_message_types()
        self._checks: dict[type[Message], dict[str, Check]] = {
            cls: field_checks(cls) for cls in self._types.values()
        }
        self._packer = msgpack.Packer(use_bin_type=True)

    def encode(
        self, msg: Message, source: str, seq: int, ts: float, topic: str | None = None
    ) -> list[bytes]:
        cls = type(msg)
        if self._types.get(cls.TYPE) is not cls:
            raise TypeError(f"{cls.__name__} is not a declared bus message")
        header = {"t": cls.TYPE, "v": cls.VERSION, "src": source, "seq": seq, "ts": ts}
        body = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
        return [
            (topic or cls.TOPIC).encode(),
            msgpack.packb(header, use_bin_type=True),
            msgpack.packb(body, use_bin_type=True),
        ]

    def decode(self, frames: Sequence[Any]) -> Envelope:
        """Decode ``[topic, header, body]`` (bytes or zmq Frames). Raises ``DecodeError``."""
        if len(frames) != 3:
            raise DecodeError("frames", f"expected 3 frames, got {len(frames)}")
        raw = [f.buffer if hasattr(f, "buffer") else f for f in frames]
        size = sum(len(r) for r in raw)
        if size > self.max_bytes:
            raise DecodeError("oversize", f"{size} bytes > {self.max_bytes}")
        header = self._unpack(raw[1])
        cls = self._types.get(header.get("t"))  # type: ignore[arg-type]
        if cls is None:
            raise DecodeError("unknown_type", repr(header.get("t"))[:80])
        if header.get("v") != cls.VERSION:
            raise DecodeError("version", f"{cls.TYPE} v{header.get('v')!r}")
        src, seq, ts = header.get("src"), header.get("seq"), header.get("ts")
        if not (isinstance(src, str) and isinstance(seq, int) and isinstance(ts, (int, float))):
            raise DecodeError("malformed", "bad header fields")
        body = self._unpack(raw[2])
        msg = self._build(cls, body)
        try:
            topic = bytes(raw[0]).decode()
        except UnicodeDecodeError as e:
            raise DecodeError("malformed", "topic is not utf-8") from e
        return Envelope(cls.TYPE, src, seq, float(ts), topic, msg)

    def _unpack(self, raw: Any) -> dict[str, Any]:
        try:
            value = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True)
        except Exception as e:  # msgpack raises several unrelated types on garbage
            raise DecodeError("malformed", type(e).__name__) from e
        if not isinstance(value, dict):
            raise DecodeError("malformed", "not a map")
        return value

    def _build(self, cls: type[Message], body: dict[str, Any]) -> Message:
        checks = self._checks[cls]
        unknown = set(body) - set(checks)
        if unknown:
            raise DecodeError("fields", f"{cls.TYPE}: unknown fields {sorted(unknown)[:5]}")
        for name, check in checks.items():
            if name in body and not check(body[name]):
                raise DecodeError("fields", f"{cls.TYPE}.{name}: wrong type")
        try:
            return cls(**body)
        except TypeError as e:  # a required field is missing
            raise DecodeError("fields", f"{cls.TYPE}: {e}") from e
