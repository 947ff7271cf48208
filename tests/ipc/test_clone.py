"""Clone-pattern replication between real processes over the real bus."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, ClassVar

import msgpack
import pytest
import zmq

from podvisor.ipc.bus import Publisher
from podvisor.ipc.clock import SYSTEM_CLOCK, FakeClock
from podvisor.ipc.clone import MapOwner, MapReplica
from podvisor.ipc.maps import (
    DESIRED,
    PLEG,
    DesiredPod,
    MapSpec,
    PlegContainer,
    PlegHealth,
    PlegPod,
    PodSetValue,
    UndeclaredMap,
)
from podvisor.ipc.paths import RunPaths

Bus = tuple["zmq.Context[Any]", RunPaths]


def _plain(value: Any) -> Any:
    return value


def raw(name: str) -> MapSpec[Any]:
    """A test map of plain msgpack values (or an old process's untyped form of a map)."""
    return MapSpec(name, _plain, _plain)


def _owner_seq(owner: Any, cmd: str) -> int:
    owner.send(cmd)
    return int(owner.wait_line(lambda s: s.startswith("seq ")).split()[1])


def test_slow_joiner_loses_nothing(procs: Any) -> None:
    owner = procs("owner.py")
    owner.wait_line(lambda s: s == "ready")
    seq = _owner_seq(owner, "burst 500")
    replica = procs("replica.py")
    state = replica.wait_state(lambda st: st["seq"] == seq)
    assert state["items"] == {f"b{i}": i for i in range(500)}


def test_replica_killed_mid_stream_ends_with_the_owners_map(procs: Any) -> None:
    owner = procs("owner.py")
    owner.wait_line(lambda s: s == "ready")
    first = procs("replica.py")
    first.wait_state(lambda st: st["synced"])
    owner.send("burst 3000")
    first.wait_state(lambda st: st["seq"] > 0)  # it is receiving the stream
    os.kill(first.popen.pid, signal.SIGKILL)
    first.kill()
    seq = int(owner.wait_line(lambda s: s.startswith("seq ")).split()[1])
    for i in range(20):
        seq = _owner_seq(owner, f"set k{i} v{i}")
    seq = _owner_seq(owner, "del b7")
    second = procs("replica.py")
    state = second.wait_state(lambda st: st["seq"] == seq)
    expected: dict[str, Any] = {f"b{i}": i for i in range(3000)}
    expected.pop("b7")
    expected.update({f"k{i}": f"v{i}" for i in range(20)})
    assert state["items"] == expected


def test_replica_follows_a_restarted_owner(procs: Any) -> None:
    owner = procs("owner.py")
    owner.wait_line(lambda s: s == "ready")
    _owner_seq(owner, "set a 1")
    replica = procs("replica.py")
    old = replica.wait_state(lambda st: st["items"] == {"a": "1"})
    owner.kill()
    owner2 = procs("owner.py")
    owner2.wait_line(lambda s: s == "ready")
    _owner_seq(owner2, "set b 2")
    new = replica.wait_state(lambda st: st["items"] == {"b": "2"})
    assert new["epoch"] != old["epoch"]


def test_sequence_gap_triggers_a_resync(bus: Bus) -> None:
    zctx, paths = bus
    pub = Publisher(zctx, paths, "gap-owner")
    owner = MapOwner(zctx, paths, pub, raw("gap"), clock=SYSTEM_CLOCK)
    changes: list[tuple[str, Any, Any]] = []
    replica = MapReplica(zctx, paths, raw("gap"),
                         on_change=lambda k, o, n: changes.append((k, o, n)), clock=SYSTEM_CLOCK)
    _wait_subscribed(replica, owner)
    _sync_with_owner(replica, owner)
    owner.set("x", 1)
    owner.set("y", 2)  # this one is "lost": the replica never handles it
    owner.set("z", 3)
    envs = _collect(replica, {"x", "y", "z"})
    resyncs = replica.resyncs
    replica.handle(envs["x"])
    replica.handle(envs["z"])
    assert "y" not in replica.items()
    _sync_with_owner(replica, owner)
    assert replica.resyncs == resyncs + 1
    assert replica.items() == owner.items()
    assert ("y", None, 2) in changes
    replica.close()
    owner.close()
    pub.close()


def _sync_with_owner(replica: MapReplica, owner: MapOwner) -> None:
    """Run the replica's blocking snapshot request while a thread plays the owner's loop."""
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            if owner.socket.poll(20):
                owner.serve()

    t = threading.Thread(target=serve)
    t.start()
    try:
        assert replica.sync()
    finally:
        done.set()
        t.join()


def _wait_subscribed(replica: MapReplica, owner: MapOwner) -> None:
    """Publish until one update reaches the replica's socket: its subscription is then active."""
    for i in range(1000):
        owner.set("probe", i)
        if replica._sub.recv(0.01) is not None:
            owner.delete("probe")
            return
    raise AssertionError("subscription never became active")


def _collect(replica: MapReplica, keys: set[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    while set(found) != keys:
        env = replica._sub.recv(5.0)
        assert env is not None, "update not delivered"
        key = getattr(env.message, "key", None)
        if key in keys:
            found[key] = env
    return found


def test_garbage_wrong_types_and_a_100mb_frame_are_dropped_and_counted(
    bus: Bus, procs: Any
) -> None:
    zctx, paths = bus
    owner = procs("owner.py")
    owner.wait_line(lambda s: s == "ready")
    _owner_seq(owner, "set a 1")
    replica = procs("replica.py")
    replica.wait_state(lambda st: st["items"] == {"a": "1"})
    evil = zctx.socket(zmq.PUB)
    evil.setsockopt(zmq.LINGER, 0)
    evil.connect(paths.bus_pub)
    topic = b"clone.test.update\0"
    bad = [
        [topic + b"first of two", b"second of two"],
        [topic + b"\xc1"],
        [topic + msgpack.packb(["clone.map.update", 1, "evil", 1, 0.0, [5]])],
        [topic + msgpack.packb(["who.knows", 1, "evil", 1, 0.0, []])],
    ]
    reasons = {"malformed", "fields", "unknown_type"}
    # Keep sending until the replica reports every reason: the evil socket may take a moment
    # to learn the replica's subscription (slow joiner), and messages before that are not sent.
    state: dict[str, Any] = {}
    for _ in range(100):
        for frames in bad:
            evil.send_multipart(frames)
        try:
            state = replica.wait_state(lambda st: reasons <= set(st["drops"]), timeout=0.5)
            break
        except TimeoutError:
            continue
    # The subscription is known now: one 100 MB frame, once (a queue of them would take
    # seconds of copying in any receiver).
    evil.send(topic + b"\x00" * (100 * 1024 * 1024))
    reasons.add("oversize")
    state = replica.wait_state(lambda st: reasons <= set(st["drops"]))
    evil.close(linger=0)
    assert reasons <= set(state["drops"]), state["drops"]
    assert replica.popen.poll() is None
    seq = _owner_seq(owner, "set b 2")
    state = replica.wait_state(lambda st: st["seq"] == seq)
    assert state["items"] == {"a": "1", "b": "2"}


def test_one_shot_sync_right_after_construction(bus: Bus) -> None:
    zctx, paths = bus
    pub = Publisher(zctx, paths, "oneshot-owner")
    owner = MapOwner(zctx, paths, pub, raw("oneshot"), clock=SYSTEM_CLOCK)
    owner.set("a", 1)
    replica = MapReplica(zctx, paths, raw("oneshot"), clock=SYSTEM_CLOCK)
    _sync_with_owner(replica, owner)
    assert replica.items() == {"a": 1}
    replica.close()
    owner.close()
    pub.close()


def test_unanswered_requests_keep_the_same_sockets_and_late_answers_are_dropped(
    bus: Bus,
) -> None:
    """Pollers register ``replica.sockets`` once: a timed-out request must not replace them,
    and once one answer is installed a second (late) answer is dropped."""
    zctx, paths = bus
    pub = Publisher(zctx, paths, "slow-owner")
    clock = FakeClock(0.0)  # one clock for the owner and the replica
    owner = MapOwner(zctx, paths, pub, raw("slow"), clock=clock)
    owner.set("v", "old")
    replica = MapReplica(zctx, paths, raw("slow"), snapshot_timeout=1.0, clock=clock)
    sockets = replica.sockets
    _until(lambda: replica.pump(0.01) or replica.waiting_for_snapshot)  # request 1 is out
    clock.advance(5.0)  # request 1 timed out: the next pump sends request 2 on the same socket
    replica.pump(0)
    assert replica.sockets == sockets and replica.waiting_for_snapshot
    owner.set("v", "new")

    def serve_and_pump() -> bool:
        owner.serve()
        replica.pump(0.05)
        return replica.synced

    _until(serve_and_pump)
    assert replica.items() == {"v": "new"}
    assert replica.resyncs == 1  # one of the two answers was installed, the other dropped
    assert replica.sockets == sockets
    replica.close()
    owner.close()
    pub.close()


def _subscribed(replica: MapReplica, owner: MapOwner, clock: FakeClock) -> None:
    """Until the replica's subscriber hears the owner (a heartbeat): PUB/SUB drops what is sent
    before a subscription is live, so an update published after this reaches the replica."""
    before = replica.received

    def heard() -> bool:
        clock.advance(60.0)  # past any heartbeat delay
        owner.tick(clock.monotonic())
        replica.pump(0.01)
        return replica.received > before

    _until(heard)


def _until(done: Any, rounds: int = 500) -> None:
    for _ in range(rounds):
        if done():
            return
    raise AssertionError("condition never met")


class _FutureSet(PodSetValue):
    VERSION: ClassVar[int] = 99


def test_typed_values_cross_in_wire_form_and_an_unknown_version_is_dropped(bus: Bus) -> None:
    zctx, paths = bus
    pub = Publisher(zctx, paths, "typed-owner")
    clock = FakeClock()
    spec = MapSpec("pods-typed", PodSetValue.to_wire, PodSetValue.from_wire)
    owner = MapOwner(zctx, paths, pub, spec, clock=clock)
    replica = MapReplica(zctx, paths, spec, clock=clock)
    value = PodSetValue("file", [{"metadata": {"name": "a"}}], [], 1.0)
    owner.set("set", value)
    owner.set("new", _FutureSet("file", [], [], 2.0))  # from a newer producer
    _sync_with_owner(replica, owner)  # the snapshot carries the wire forms
    assert replica.get("set") == value and isinstance(replica.get("set"), PodSetValue)
    assert replica.get("new") is None  # an unknown version is dropped ...
    assert replica.value_drops["version"] >= 1  # ... and counted
    replica.close()
    owner.close()
    pub.close()


def test_a_desired_replica_drops_and_counts_an_old_owners_values(bus: Bus) -> None:
    """A rolling restart: an owner of the untyped (v0) form beside a replica of the typed one
    (and the other way round). Nothing crashes; the replica keeps what it can read."""
    zctx, paths = bus
    pub = Publisher(zctx, paths, "old-owner")
    clock = FakeClock()
    old = MapOwner(zctx, paths, pub, raw(DESIRED.name), clock=clock)  # no types
    replica = MapReplica(zctx, paths, DESIRED, clock=clock)  # the declared spec
    typed = DesiredPod(pod={"metadata": {"uid": "u2"}}, source="file")
    old.set("u1", {"pod": {"metadata": {"uid": "u1"}}, "worker": "syncing", "admitted": True})
    old.set("_runtime", {"networkReady": True, "condition": "ok"})
    old.set("u2", typed.to_wire())
    _sync_with_owner(replica, old)
    assert replica.items() == {"u2": typed}
    assert replica.value_drops["version"] == 2
    # an update of the old form after the snapshot: dropped, the key keeps what it had
    _subscribed(replica, old, clock)
    old.set("u2", {"pod": {}, "worker": "terminated", "admitted": True})
    _until(lambda: (replica.pump(0.01), replica.seq == old.seq)[1])
    assert replica.get("u2") == typed and replica.value_drops["version"] == 3
    # an old reader (no decode) of a typed owner sees wire dicts it can tell apart by "v"
    untyped = MapReplica(zctx, paths, raw(DESIRED.name), clock=clock)
    _sync_with_owner(untyped, old)
    assert untyped.get("u2") == {"pod": {}, "worker": "terminated", "admitted": True}
    untyped.close()
    replica.close()
    old.close()
    pub.close()


def test_a_pleg_replica_drops_and_counts_an_old_owners_untyped_records(bus: Bus) -> None:
    """The same rolling restart for ``pleg``: an old PLEG's record dicts and ``_health`` are
    dropped and counted by a typed replica; its typed values are read."""
    zctx, paths = bus
    pub = Publisher(zctx, paths, "old-pleg")
    clock = FakeClock()
    old = MapOwner(zctx, paths, pub, raw(PLEG.name), clock=clock)  # no types
    replica = MapReplica(zctx, paths, PLEG, clock=clock)  # the declared spec
    typed = PlegPod(ts=2.0, name="web", containers=(PlegContainer("c1", "app", "RUNNING"),))
    old.set("u1", {"ts": 1.0, "name": "web", "namespace": "", "sandboxes": [],
                   "containers": []})
    old.set("_health", {"ts": 1.0, "last_relist_ok": 5.0, "relists": 1})
    old.set("u2", typed.to_wire())
    _sync_with_owner(replica, old)
    assert replica.items() == {"u2": typed}
    assert replica.value_drops["version"] == 2
    _subscribed(replica, old, clock)
    old.set("_health", PlegHealth(ts=3.0, relists=2).to_wire())
    _until(lambda: (replica.pump(0.01), replica.seq == old.seq)[1])
    assert replica.get("_health") == PlegHealth(ts=3.0, relists=2)
    replica.close()
    old.close()
    pub.close()


def test_a_map_without_its_spec_is_refused(bus: Bus) -> None:
    """No owner or replica of a bare map name: every map is read and written through its
    declared type (ipc/maps.py), never as raw values."""
    zctx, paths = bus
    pub = Publisher(zctx, paths, "nameless")
    with pytest.raises(UndeclaredMap, match="'desired' has no MapSpec"):
        MapReplica(zctx, paths, "desired", clock=SYSTEM_CLOCK)  # type: ignore[arg-type]
    with pytest.raises(UndeclaredMap, match="'api-mirrors' has no MapSpec"):
        MapOwner(zctx, paths, pub, "api-mirrors", clock=SYSTEM_CLOCK)  # type: ignore[arg-type]
    pub.close()
