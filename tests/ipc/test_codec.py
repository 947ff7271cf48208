"""The envelope codec: every declared message round-trips; anything else is rejected by reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import msgpack
import pytest

from podvisor.ipc.codec import Codec, DecodeError, _all_message_types
from podvisor.ipc.messages import MapUpdate, Message, Probe, ProcessStateChanged


def _pack(obj: object) -> bytes:
    return bytes(msgpack.packb(obj, use_bin_type=True))


def test_round_trip_keeps_header_and_fields() -> None:
    codec = Codec()
    msg = ProcessStateChanged(name="pleg", from_state="STARTING", to_state="RUNNING", pid=42,
                              restarts=3, exit_code=None, reason="", ts=1.5)
    env = codec.decode(codec.encode(msg, "supervisor", 7, 12.25))
    assert (env.type, env.source, env.seq, env.ts, env.topic) == (
        "supervisor.process.state", "supervisor", 7, 12.25, "supervisor.process.state")
    assert env.message == msg


def test_topic_override_and_any_values() -> None:
    codec = Codec()
    msg = MapUpdate(map="pods", epoch="e", seq=1, key="k", value={"a": [1, b"x", None]})
    env = codec.decode(codec.encode(msg, "o", 1, 0.0, topic="clone.pods.update"))
    assert env.topic == "clone.pods.update" and env.message == msg


def test_every_declared_message_has_unique_type_topic_and_version() -> None:
    types = _all_message_types()
    assert len(types) >= 4
    for name, cls in types.items():
        assert name == cls.TYPE and cls.TOPIC and cls.VERSION >= 1
        assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


def _env(t: object = "bus.probe.sent", v: object = 1, src: object = "x",
         fields: object = None) -> bytes:
    return b"t\0" + _pack([t, v, src, 1, 0.0, [1] if fields is None else fields])


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([b"t\0" + _pack(1), b"second frame"], "frames"),
        ([], "frames"),
        ([b"no separator at all"], "malformed"),
        ([b"t\0\xc1\xc1\xc1"], "malformed"),
        ([b"t\0" + _pack({"t": 1})], "malformed"),
        ([b"t\0" + _pack([1, 2])], "malformed"),
        ([_env(t="no.such.type")], "unknown_type"),
        ([_env(t=7)], "unknown_type"),
        ([_env(v=99)], "version"),
        ([_env(src=3)], "malformed"),
        ([_env(fields={"n": 1})], "malformed"),
        ([_env(fields=["one"])], "fields"),
        ([_env(fields=[True])], "fields"),
        ([_env(fields=[])], "fields"),
        ([_env(fields=[1, {}, "extra"])], "fields"),
        ([_env(fields=[1, [1]])], "fields"),
        ([b"t\0" + _pack(["bus.probe.sent", 1, "x", 1, 0.0, [1, {1: 2}]])], "malformed"),
        ([b"\xff\0" + _pack(["bus.probe.sent", 1, "x", 1, 0.0, [1]])], "malformed"),
    ],
)
def test_bad_frames_are_rejected_with_a_reason(frames: list[bytes], reason: str) -> None:
    with pytest.raises(DecodeError) as err:
        Codec().decode(frames)
    assert err.value.reason == reason


def test_a_frame_is_the_topic_then_the_envelope() -> None:
    [frame] = Codec().encode(Probe(n=3), "src", 9, 1.5, topic="clone.x.update")
    topic, _, packed = frame.partition(b"\0")
    assert topic == b"clone.x.update"
    assert msgpack.unpackb(packed) == ["bus.probe.sent", 1, "src", 9, 1.5, [3, {}]]


def test_oversize_is_rejected_before_unpacking() -> None:
    codec = Codec(max_bytes=1024)
    frames = codec.encode(Probe(n=1, payload={"x": "y" * 2000}), "s", 1, 0.0)
    with pytest.raises(DecodeError) as err:
        codec.decode(frames)
    assert err.value.reason == "oversize"


def test_undeclared_message_cannot_be_encoded() -> None:
    @dataclass(frozen=True)
    class Stray(Message):
        TYPE: ClassVar[str] = ""
        n: int = 0

    with pytest.raises(TypeError):
        Codec().encode(Stray(), "s", 1, 0.0)
