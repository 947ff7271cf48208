"""Unit tests: event store (aggregation, ring bound, persistence), reasons for manifest errors,
the sync loop's log bridge, the recorder, the held-until-subscribed publisher, CRI log decoding
and the logs file finder."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from podvisor.cli.ctl_logs import (
    CriDecoder,
    LogError,
    find_log_dir,
    follow,
    format_events,
    latest_log,
    tail_lines,
)
from podvisor.common import FakeClock
from podvisor.ipc.bus import BusProxy, Subscriber
from podvisor.ipc.messages import Event, Message
from podvisor.ipc.paths import RunPaths
from podvisor.services.events import model as ev
from podvisor.services.events.logbridge import EventingLog, events_for
from podvisor.services.events.publisher import EventPublisher
from podvisor.services.events.recorder import Recorder
from podvisor.supervisor.eventstore import EventStore
from tests.support.plegs import pleg_pod


def event(reason: str = "Started", message: str = "m", ts: float = 100.0,
          name: str = "p") -> Event:
    return ev.new_event(ev.NORMAL, reason, message, ev.pod_object(name, "default", "u1"),
                        "syncloop", ts)


def test_store_aggregates_identical_events_and_bounds_the_ring(tmp_path: Path) -> None:
    store = EventStore(tmp_path / "events.jsonl", capacity=3)
    store.add(event(ts=1.0))
    store.add(event(ts=5.0))
    store.add(event(message="other", ts=2.0))
    recs = store.records()
    assert [(r["message"], r["count"]) for r in recs] == [("other", 1), ("m", 2)]
    assert recs[1]["first_ts"] == 1.0 and recs[1]["last_ts"] == 5.0
    for i in range(5):
        store.add(event(message=f"n{i}", ts=10.0 + i))
    assert [r["message"] for r in store.records()] == ["n2", "n3", "n4"]
    out = store.event_list(limit=2)
    assert out["kind"] == "EventList" and [e["message"] for e in out["items"]] == ["n3", "n4"]
    item = out["items"][0]
    assert item["involvedObject"] == {"kind": "Pod", "name": "p", "namespace": "default",
                                      "uid": "u1"}
    assert item["source"] == {"component": "syncloop"} and item["lastTimestamp"].endswith("Z")


def test_store_persists_at_most_every_interval_and_loads(tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    path = tmp_path / "state" / "events.jsonl"
    store = EventStore(path, persist_interval=1.0, clock=clock)
    assert store.next_deadline() is None and not store.persist()
    store.add(event())
    assert store.persist() and path.exists()
    store.add(event(message="b"))
    assert store.next_deadline() == 1.0 and not store.persist()
    clock.now = 1.0
    assert store.persist()
    path.write_text(path.read_text() + "not json\n{\"type\": 1}\n")
    again = EventStore(path)
    assert again.load() == 2
    assert [r["message"] for r in again.records()] == ["m", "b"]
    again.add(event())
    assert [r["count"] for r in again.records()] == [1, 2]


def test_store_file_follows_aggregation_and_eviction(tmp_path: Path) -> None:
    """Each record's line is rendered once and kept; an aggregated or evicted record is
    written anew or left out, so the file is always the ring."""
    path = tmp_path / "events.jsonl"
    store = EventStore(path, capacity=2, persist_interval=0.0)

    def on_disk() -> list[tuple[str, int]]:
        return [(r["message"], r["count"]) for r in map(json.loads, path.read_text().splitlines())]

    store.add(event(message="a"))
    store.add(event(message="b"))
    assert store.persist() and on_disk() == [("a", 1), ("b", 1)]
    store.add(event(message="a", ts=200.0))
    assert store.persist() and on_disk() == [("b", 1), ("a", 2)]
    store.add(event(message="c"))
    assert store.persist() and on_disk() == [("a", 2), ("c", 1)]
    again = EventStore(path)
    assert again.load() == 2
    again.add(event(message="c", ts=300.0))
    assert again.persist() and on_disk() == [("a", 2), ("c", 2)]


def test_store_truncates_long_messages(tmp_path: Path) -> None:
    store = EventStore(None)
    rec = store.add(event(message="x" * 5000))
    assert len(rec["message"]) == 1024 and rec["message"].endswith("...")


@pytest.mark.parametrize(("field", "reason", "code"), [
    ("", "file is larger than 10 MiB (20971520 bytes); not read", ev.FILE_TOO_LARGE),
    ("", "pod is larger than 1536 KiB once decoded", ev.FILE_TOO_LARGE),
    ("", "invalid YAML: while parsing a flow mapping", ev.FAILED_PARSE),
    ("", "not UTF-8 text (byte 3)", ev.FAILED_PARSE),
    ("", "found 2 YAML documents; put one Pod per file", ev.FAILED_PARSE),
    ("kind", "expected a Pod, got 'Deployment' (podvisor runs Pods only)", ev.WRONG_KIND),
    ("spec.volumes[0].secret", "static pods may not reference API objects (Secret volume)",
     ev.REFERENCES_API_OBJECT),
    ("spec.containers[0].image", "required", ev.FAILED_VALIDATION),
    ("", "cannot read: Permission denied", ev.FAILED_READ),
])
def test_manifest_error_reasons(field: str, reason: str, code: str) -> None:
    assert ev.manifest_error_reason(field, reason) == code


def test_log_bridge_maps_syncloop_lines_to_events() -> None:
    assert [r for _, r, _ in events_for("syncloop.container.started", {"container": "a"})] == \
        ["Created", "Started"]
    (t, r, m), = events_for("syncloop.container.waiting", {
        "reason": "CrashLoopBackOff", "container": "app", "pod": "web_default"})
    assert (t, r) == (ev.WARNING, "BackOff") and m == \
        "Back-off restarting failed container app in pod web in namespace default"
    assert events_for("syncloop.container.waiting", {"reason": "PodInitializing"}) == []
    assert events_for("syncloop.pod.rejected", {"reason": "HostPortConflict",
                                                "message": "port 80"}) == \
        [(ev.WARNING, "HostPortConflict", "port 80")]
    assert events_for("syncloop.volume.failed", {"volume": "data", "message": "MountVolume"}) \
        == [(ev.WARNING, "FailedMount", "MountVolume")]
    assert events_for("syncloop.pod.update", {}) == []
    # [issue 24] the kubelet's reasons for the pod lifecycle fields
    assert events_for("syncloop.container.poststart_failed", {"message": "secret output"}) == \
        [(ev.WARNING, "FailedPostStartHook", "PostStartHook failed")]  # output not leaked
    assert events_for("syncloop.pod.failed", {"reason": "DeadlineExceeded", "message": "late",
                                              "event_type": "Normal"}) == \
        [(ev.NORMAL, "DeadlineExceeded", "late")]
    assert events_for("syncloop.pod.failed", {"reason": "Evicted", "message": "low on memory",
                                              "event_type": "Warning"}) == \
        [(ev.WARNING, "Evicted", "low on memory")]
    assert [r for _, r, _ in events_for("syncloop.pod.pull_secrets_missing", {})] == \
        ["FailedToRetrieveImagePullSecret"]
    assert events_for("syncloop.pod.update_refused", {"reason": "UnsupportedPodUpdate",
                                                      "message": "m"}) == \
        [(ev.WARNING, "UnsupportedPodUpdate", "m")]

    class Log:
        def __init__(self) -> None:
            self.lines: list[tuple[str, str]] = []

        def info(self, event: str, **fields: Any) -> None:
            self.lines.append(("info", event))

        def bind(self, **fields: Any) -> str:
            return "bound"

    log, rec, sent = Log(), Recorder("syncloop", wall=lambda: 7.0), Sink()
    bridge = EventingLog(log, rec)
    bridge.info("syncloop.container.killing", pod="web_ns", pod_uid="u", container="c")
    assert log.lines == [("info", "syncloop.container.killing")] and bridge.bind() == "bound"
    rec.resolve = lambda obj: {**obj, "file": "/m/web.yaml"}
    assert rec.flush(sent) == 1 and sent.pumps == 1
    msg = sent.got[0]
    assert isinstance(msg, Event) and msg.reason == "Killing" and msg.first_ts == 7.0
    assert msg.object == {"kind": "Pod", "uid": "u", "name": "web", "namespace": "ns",
                          "fieldPath": "spec.containers{c}", "file": "/m/web.yaml"}


def test_log_bridge_network_and_sandbox_events() -> None:
    """NetworkReady changes are events on the Node, a held pod's on the Pod, a sandbox stop
    that failed (retried with back-off) a FailedKillPod."""
    cond = "container runtime network not ready: NetworkReady=false reason:R message:M"
    assert events_for("syncloop.runtime.network_not_ready", {"message": cond}) == \
        [(ev.WARNING, "NetworkNotReady", cond)]
    assert events_for("syncloop.runtime.network_ready", {"message": "ready"}) == \
        [(ev.NORMAL, "NetworkReady", "ready")]
    assert events_for("syncloop.pod.network_not_ready", {"message": "network is not ready"}) \
        == [(ev.WARNING, "NetworkNotReady", "network is not ready")]
    assert events_for("syncloop.sandbox.stop_failed", {
        "sandbox_id": "s1", "error": "cni plugin not initialized", "retry_in": 4.0}) == [
        (ev.WARNING, "FailedKillPod", "error killing pod: failed to stop sandbox s1: cni plugin "
                                      "not initialized (retried in 4.0s)")]

    class Log:
        def warning(self, event: str, **fields: Any) -> None:
            pass

    rec, sent = Recorder("syncloop", wall=lambda: 7.0), Sink()
    bridge = EventingLog(Log(), rec)
    bridge.warning("syncloop.runtime.network_not_ready", node="n1", message=cond)
    bridge.warning("syncloop.pod.network_not_ready", pod="web_ns", pod_uid="u",
                   message="network is not ready: " + cond)
    assert rec.flush(sent) == 2
    node, pod = sent.got
    assert isinstance(node, Event) and node.object == {"kind": "Node", "name": "n1"}
    assert isinstance(pod, Event) and pod.object == {"kind": "Pod", "uid": "u", "name": "web",
                                                     "namespace": "ns"}


class Sink:
    def __init__(self) -> None:
        self.got: list[Message] = []
        self.pumps = 0

    def send(self, msg: Message) -> bool:
        self.got.append(msg)
        return True

    def pump(self) -> None:
        self.pumps += 1


def test_container_died_event_from_a_pleg_record() -> None:
    record = pleg_pod(name="web", namespace="default", containers=[
        {"id": "c1", "name": "app", "state": "CONTAINER_EXITED", "exit_code": 137,
         "reason": "OOMKilled"}])
    died = ev.container_died(record, "c1", "u1", "pleg", 5.0)
    assert died is not None and died.type == ev.WARNING
    assert died.message == "Container app exited with code 137 (OOMKilled)"
    assert ev.container_died(record, "sandbox", "u1", "pleg", 5.0) is None
    assert ev.container_died(None, "c1", "u1", "pleg", 5.0) is None


def test_publisher_holds_events_until_someone_subscribes(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    paths.ensure()
    zctx: zmq.Context[Any] = zmq.Context()
    proxy = BusProxy(zctx, paths)
    proxy.start()
    pub = EventPublisher(zctx, paths, "source-file", limit=2)
    try:
        for i in range(3):
            pub.send(event(message=f"e{i}"))
        assert not pub.subscribed and pub.sent == 0 and pub.dropped == 1
        sub = Subscriber(zctx, paths, ["events."])
        got: list[str] = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            pub.pump()
            env = sub.recv(0.05)
            if env is not None and isinstance(env.message, Event):
                got.append(env.message.message)
        assert got == ["e1", "e2"]
        sub.close()
    finally:
        pub.close()
        proxy.stop()
        zctx.destroy(linger=0)


# --- logs ---


def cri(stream: str, tag: str, msg: str) -> bytes:
    return f"2024-05-01T12:00:00.000000000Z {stream} {tag} {msg}\n".encode()


def test_decoder_joins_partial_records_per_stream() -> None:
    dec = CriDecoder()
    data = (cri("stdout", "P", "hel") + cri("stderr", "F", "err") + cri("stdout", "F", "lo")
            + cri("stdout", "F", "") + b"garbage line\n" + cri("stdout", "F", "tail")[:40])
    assert dec.feed(data) == [b"err\n", b"hello\n", b"\n", b"garbage line\n"]
    assert dec.feed(cri("stdout", "F", "tail")[40:]) == [b"tail\n"]


def pod_dir(root: Path, ns: str, name: str, uid: str, containers: dict[str, int]) -> Path:
    d = root / "pod-logs" / f"{ns}_{name}_{uid}"
    for c, restarts in containers.items():
        (d / c).mkdir(parents=True)
        for n in range(restarts + 1):
            (d / c / f"{n}.log").write_bytes(cri("stdout", "F", f"{c} run {n}"))
    return d


def test_find_log_dir_and_tail(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"nodeName": "n1"}))
    pod_dir(tmp_path, "default", "web-n1", "u1", {"app": 2})
    pod_dir(tmp_path, "kube", "dns-n1", "u2", {"a": 0, "b": 0})
    cdir = find_log_dir(tmp_path, "web", None)
    assert cdir.name == "app" and latest_log(cdir) == (2, cdir / "2.log")
    assert tail_lines([cdir / "1.log", cdir / "2.log"], 1) == [b"app run 2\n"]
    assert find_log_dir(tmp_path, "kube/dns-n1", "b").name == "b"
    with pytest.raises(LogError, match=r"choose one of: \[a b\]"):
        find_log_dir(tmp_path, "dns", None)
    with pytest.raises(LogError, match="not found"):
        find_log_dir(tmp_path, "other/web", None)
    with pytest.raises(LogError, match='container "c" is not valid'):
        find_log_dir(tmp_path, "dns", "c")
    # two UIDs of one name: the one the sync loop wants wins, else the newest
    old = pod_dir(tmp_path, "default", "web-n1", "u0", {"app": 0})
    os.utime(old, (1, 1))
    assert find_log_dir(tmp_path, "web", None, desired=lambda: {"u0"}).parent.name.endswith("u0")
    assert find_log_dir(tmp_path, "web", None, desired=set).parent.name.endswith("u1")


def test_follow_reads_appends_and_moves_to_the_next_restart(tmp_path: Path) -> None:
    cdir = pod_dir(tmp_path, "default", "web", "u1", {"app": 0}) / "app"
    out: list[bytes] = []

    class Out:
        def write(self, b: bytes) -> None:
            out.append(b)

        def flush(self) -> None:
            pass

    steps = iter([
        lambda: (cdir / "0.log").open("ab").write(cri("stdout", "F", "more")),
        lambda: (cdir / "1.log").write_bytes(cri("stdout", "F", "restarted")),
        lambda: None,
    ])
    done = []

    def sleep(_: float) -> None:
        try:
            next(steps)()
        except StopIteration:
            done.append(True)

    follow(cdir, (0, cdir / "0.log"), (cdir / "0.log").stat().st_size, Out(),  # type: ignore[arg-type]
           stop=lambda: bool(done), sleep=sleep)
    assert b"".join(out) == b"more\nrestarted\n"


def test_format_events_table() -> None:
    store = EventStore(None)
    store.add(event(ts=100.0))
    store.add(event(ts=160.0))
    text = format_events(store.event_list(), now=220.0)
    header, row = text.splitlines()
    assert header.split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert row.split() == ["1m", "Normal", "Started", "pod/p", "m", "(x2)"]
