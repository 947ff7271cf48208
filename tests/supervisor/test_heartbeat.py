"""Heartbeats as a shared-memory write (`BeatSlot` in the child, `BeatReader` in the
supervisor) and the PUSH fallback of `HeartbeatSender`."""

from __future__ import annotations

from pathlib import Path

import zmq

from podvisor.common import FakeClock
from podvisor.supervisor.heartbeat import (
    BEAT,
    READY,
    BeatReader,
    BeatSlot,
    HeartbeatSender,
    beat_file,
    decode_beat,
)


def test_beat_file_names_only_safe_process_names(tmp_path: Path) -> None:
    assert beat_file(tmp_path, "pleg") == tmp_path / "beat-pleg"
    assert beat_file(tmp_path, "my_proc-2.x") == tmp_path / "beat-my_proc-2.x"
    assert beat_file(tmp_path, "../x") is None and beat_file(tmp_path, "") is None


def test_reader_sees_each_new_beat_of_the_current_pid_only(tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    reader = BeatReader(tmp_path, reopen_after=2.0, clock=clock)
    assert not reader.new_beat("svc", 100)  # no file yet
    slot = BeatSlot(tmp_path / "beat-svc", 100)
    slot.beat()
    assert reader.new_beat("svc", 100)
    assert not reader.new_beat("svc", 100)  # nothing new since
    slot.beat()
    assert reader.new_beat("svc", 100)
    assert not reader.new_beat("svc", 200)  # beats of another incarnation are ignored
    slot.close()
    # a new incarnation reuses the file (never truncated: the reader may hold it mapped)
    new = BeatSlot(tmp_path / "beat-svc", 200)
    new.beat()
    assert reader.new_beat("svc", 200)
    new.close()
    reader.close()


def test_reader_maps_a_replaced_file_again(tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    reader = BeatReader(tmp_path, reopen_after=2.0, clock=clock)
    old = BeatSlot(tmp_path / "beat-svc", 7)
    old.beat()
    assert reader.new_beat("svc", 7)
    old.close()
    (tmp_path / "beat-svc").unlink()
    new = BeatSlot(tmp_path / "beat-svc", 7)
    new.beat()
    new.beat()
    assert not reader.new_beat("svc", 7)  # still reading the old (unlinked) file
    clock.now = 2.5
    assert not reader.new_beat("svc", 7)  # nothing new for 2 s: the mapping is dropped
    assert reader.new_beat("svc", 7)  # mapped again: the new file's beats are seen
    new.close()
    reader.close()


def test_sender_writes_beats_to_its_slot_and_ready_over_push(tmp_path: Path) -> None:
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    endpoint = f"ipc://{tmp_path}/hb.sock"
    pull = zctx.socket(zmq.PULL)
    pull.bind(endpoint)
    clock = FakeClock(0.0)
    sender = HeartbeatSender(zctx, endpoint, "svc", 42, 0.9, clock,
                             beat_path=beat_file(tmp_path, "svc"))
    reader = BeatReader(tmp_path, clock=clock)
    try:
        assert sender.ready()
        assert pull.poll(5000)
        ready = decode_beat(pull.recv())
        assert ready is not None and ready.kind == READY and ready.pid == 42
        assert not sender.beat()  # rate-limited: `ready` went out just now
        clock.now = 1.0
        assert sender.beat() and reader.new_beat("svc", 42)
        assert not sender.beat() and not reader.new_beat("svc", 42)
        clock.now = 2.0
        assert sender.beat() and reader.new_beat("svc", 42)
        assert not pull.poll(50)  # no beat went over the socket
    finally:
        sender.close()
        reader.close()
        pull.close(linger=0)
        zctx.destroy(linger=0)


def test_sender_falls_back_to_push_when_its_slot_cannot_be_mapped(tmp_path: Path) -> None:
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    endpoint = f"ipc://{tmp_path}/hb.sock"
    pull = zctx.socket(zmq.PULL)
    pull.bind(endpoint)
    sender = HeartbeatSender(zctx, endpoint, "svc", 42, 0.9, FakeClock(0.0),
                             beat_path=tmp_path / "missing-dir" / "beat-svc")
    try:
        assert sender.beat() and sender.slot is None
        assert pull.poll(5000)
        beat = decode_beat(pull.recv())
        assert beat is not None and beat.kind == BEAT and beat.name == "svc"
    finally:
        sender.close()
        pull.close(linger=0)
        zctx.destroy(linger=0)
