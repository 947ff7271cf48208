"""Evented PLEG (``Relister.apply_events`` over ``evented.apply_event``) with the CRI fake's
event stream: records and lifecycle events from events alone (no CRI call), the same as a
relist would give; stale events never move anything back; unknown pods are created."""

from __future__ import annotations

import queue
from typing import Any

from cri_api.v1 import api_pb2 as pb

from podvisor.common import FakeClock
from podvisor.services.cri.fake import FakeEventStream, FakeRuntimeClient
from podvisor.services.pleg.evented import apply_event
from podvisor.services.pleg.records import (
    container_record,
    container_record_of_status,
    sandbox_record,
)
from podvisor.services.pleg.relist import HOLD, Relister, new_relister
from tests.services.pleg.test_pleg_relist import container, kinds, labels, sandbox

PLEG_CALLS = ("ListPodSandbox", "ListContainers", "ContainerStatus", "PodSandboxStatus")


def take(stream: FakeEventStream) -> list[pb.ContainerEventResponse]:
    out = []
    while True:
        try:
            out.append(stream.queue.get_nowait())
        except queue.Empty:
            return out


def pleg_calls(client: FakeRuntimeClient) -> int:
    return sum(len(client.method_calls(m)) for m in PLEG_CALLS)


def setup() -> tuple[FakeRuntimeClient, FakeClock, Relister, FakeEventStream]:
    client, clock = FakeRuntimeClient(), FakeClock(100.0)
    stream = client.container_events()
    return client, clock, new_relister(client, clock), stream


def without_ts(records: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {uid: {k: v for k, v in r.items() if k != "ts"} for uid, r in records.items()}


def test_events_alone_build_the_same_records_as_a_relist_without_cri_calls() -> None:
    client, clock, rel, stream = setup()
    rel.relist()  # empty runtime
    sid, scfg = sandbox(client, "u1")
    cid = container(client, sid, scfg, "u1", start=False)
    calls = pleg_calls(client)
    clock.now = 101.0
    res = rel.apply_events(take(stream), 100.5)
    assert res.events == [] and res.changed == {}  # held: the container was just created
    assert rel.held_until() == 100.5 + HOLD
    client.start_container(cid)
    res = rel.apply_events(take(stream), 101.0)
    assert kinds(res) == [("u1", "ContainerStarted", cid), ("u1", "ContainerStarted", sid)]
    assert res.ts == 101.0 and res.changed["u1"]["ts"] == 101.0 and rel.held_until() is None
    c = res.changed["u1"]["containers"][0]
    assert c["state"] == "CONTAINER_RUNNING" and c["started_at"] > 0 and c["sandbox_id"] == sid
    assert c["hash"] == "h1" and c["restart_count"] == 0 and c["image"] == "host"
    assert pleg_calls(client) == calls  # not one CRI call
    # a fresh relister reading the runtime renders exactly the same records
    fresh = new_relister(client, clock)
    fresh.relist()
    assert without_ts(rel.records()) == without_ts(fresh.records())
    # and the next relist of the evented one finds nothing new, inspects nothing
    calls = len(client.method_calls("ContainerStatus"))
    res = rel.relist()
    assert res.events == [] and res.changed == {} and res.removed == []
    assert len(client.method_calls("ContainerStatus")) == calls


def test_restart_died_changed_started_removed_from_events() -> None:
    client, _clock, rel, stream = setup()
    sid, scfg = sandbox(client, "u1")
    old = container(client, sid, scfg, "u1")
    rel.relist()
    take(stream)  # what the relist covered
    calls = pleg_calls(client)
    client.exit_container(old, 137)
    new = container(client, sid, scfg, "u1", restarts=1)
    client.remove_container(old)
    res = rel.apply_events(take(stream), 102.0)
    # one batch: diffed as a relist would (what was published -> now)
    assert kinds(res) == [("u1", "ContainerDied", old), ("u1", "ContainerRemoved", old),
                          ("u1", "ContainerStarted", new)]
    rec = res.changed["u1"]
    assert [(c["id"], c["state"]) for c in rec["containers"]] == [(new, "CONTAINER_RUNNING")]
    assert pleg_calls(client) == calls
    assert kinds(rel.relist()) == []


def test_death_carries_exit_code() -> None:
    client, _clock, rel, stream = setup()
    sid, scfg = sandbox(client, "u1")
    cid = container(client, sid, scfg, "u1")
    rel.relist()
    take(stream)
    client.exit_container(cid, 3)
    res = rel.apply_events(take(stream), 103.0)
    assert kinds(res) == [("u1", "ContainerDied", cid)]
    c = res.changed["u1"]["containers"][0]
    assert c["state"] == "CONTAINER_EXITED" and c["exit_code"] == 3 and c["reason"] == "Error"
    assert c["finished_at"] > 0


def test_other_sandboxes_of_the_pod_keep_their_records() -> None:
    client, _clock, rel, stream = setup()
    old_sid, scfg = sandbox(client, "u1")
    old_cid = container(client, old_sid, scfg, "u1")
    client.exit_container(old_cid, 0)
    new_sid, scfg2 = sandbox(client, "u1")
    rel.relist()
    take(stream)
    cid = container(client, new_sid, scfg2, "u1")
    res = rel.apply_events(take(stream), 104.0)
    assert kinds(res) == [("u1", "ContainerStarted", cid)]
    rec = res.changed["u1"]
    assert [s["id"] for s in rec["sandboxes"]] == [old_sid, new_sid]
    assert [(c["id"], c["sandbox_id"]) for c in rec["containers"]] == [(old_cid, old_sid),
                                                                      (cid, new_sid)]
    assert kinds(rel.relist()) == []


def test_event_for_an_unknown_pod_creates_its_record() -> None:
    client, _clock, rel, stream = setup()
    sid, scfg = sandbox(client, "u2", "other")
    cid = container(client, sid, scfg, "u2")
    res = rel.apply_events(take(stream), 105.0)  # no relist ever
    assert ("u2", "ContainerStarted", cid) in kinds(res)
    rec = rel.records()["u2"]
    assert rec["name"] == "other" and rec["namespace"] == "default"
    assert rec["sandboxes"][0]["id"] == sid and rec["containers"][0]["id"] == cid


def test_stale_events_after_a_relist_move_nothing_back() -> None:
    client, _clock, rel, stream = setup()
    sid, scfg = sandbox(client, "u1")
    cid = container(client, sid, scfg, "u1")  # CREATED + STARTED events queued
    gone = container(client, sid, scfg, "u1", "gone")
    client.exit_container(cid, 1)
    client.remove_container(gone)
    rel.relist()  # sees cid exited, `gone` never
    stale = take(stream)
    res = rel.apply_events(stale[:4], 106.0)  # up to STARTED of `gone`: older than the relist
    assert res.events == [] and res.changed == {}
    assert rel.records()["u1"]["containers"][0]["state"] == "CONTAINER_EXITED"
    assert [c["id"] for c in rel.records()["u1"]["containers"]] == [cid]
    res = rel.apply_events(stale[4:], 106.5)  # the rest: nothing new either
    assert res.events == [] and res.changed == {}


def test_removed_ids_are_not_resurrected_by_stale_events() -> None:
    client, _clock, rel, stream = setup()
    sid, scfg = sandbox(client, "u1")
    cid = container(client, sid, scfg, "u1")
    rel.relist()
    client.stop_container(cid, 0)
    client.remove_container(cid)
    stale = take(stream)
    assert kinds(rel.relist()) == [("u1", "ContainerDied", cid), ("u1", "ContainerRemoved", cid)]
    res = rel.apply_events(stale, 107.0)  # STOPPED (with cid) then DELETED
    assert res.events == [] and res.changed == {}
    assert rel.records()["u1"]["containers"] == []


def test_a_pod_with_nothing_left_is_removed() -> None:
    _client, _clock, rel, _stream = setup()
    lab = labels("u3")
    sb = pb.PodSandboxStatus(id="s3", metadata=pb.PodSandboxMetadata(name="web", uid="u3"),
                             state=pb.SANDBOX_READY, created_at=5, labels=lab)
    st = pb.ContainerStatus(id="c3", metadata=pb.ContainerMetadata(name="app"),
                            state=pb.CONTAINER_RUNNING, created_at=6, labels=lab)
    rel.apply_events([pb.ContainerEventResponse(
        container_id="c3", container_event_type=pb.CONTAINER_STARTED_EVENT, created_at=7,
        pod_sandbox_status=sb, containers_statuses=[st])], 1.0)
    assert set(rel.records()) == {"u3"}
    # a sandbox event (containerd 2 sends them): DELETED of the sandbox takes its containers
    res = rel.apply_events([pb.ContainerEventResponse(
        container_id="s3", container_event_type=pb.CONTAINER_DELETED_EVENT, created_at=8,
        pod_sandbox_status=sb)], 2.0)
    assert res.removed == ["u3"] and rel.records() == {}
    assert kinds(res) == [("u3", "ContainerDied", "c3"), ("u3", "ContainerRemoved", "c3"),
                          ("u3", "ContainerDied", "s3"), ("u3", "ContainerRemoved", "s3")]


def test_event_without_sandbox_status_finds_its_pod() -> None:
    client, _clock, rel, _stream = setup()
    sid, scfg = sandbox(client, "u1")
    cid = container(client, sid, scfg, "u1")
    rel.relist()
    bare = pb.ContainerEventResponse(container_id=cid, created_at=9,
                                     container_event_type=pb.CONTAINER_DELETED_EVENT)
    res = rel.apply_events([bare], 108.0)
    assert kinds(res) == [("u1", "ContainerDied", cid), ("u1", "ContainerRemoved", cid)]
    foreign = pb.ContainerEventResponse(container_id="nobody", created_at=9,
                                        container_event_type=pb.CONTAINER_STOPPED_EVENT)
    assert rel.apply_events([foreign], 109.0).events == []


def test_apply_event_is_pure_and_keeps_name() -> None:
    lab = labels("u4", "named")
    sb = pb.PodSandboxStatus(id="s4", metadata=pb.PodSandboxMetadata(name="x", uid="u4"),
                             state=pb.SANDBOX_NOTREADY, created_at=5, labels=lab)
    up = apply_event(pb.ContainerEventResponse(
        container_id="c4", container_event_type=pb.CONTAINER_STOPPED_EVENT,
        pod_sandbox_status=sb), None, 3.0)
    assert up.record is not None and up.record["name"] == "named"
    assert up.record["sandboxes"][0]["state"] == "SANDBOX_NOTREADY"
    assert up.fresh["s4"][0] == "SANDBOX_NOTREADY" and up.removed == []
    ready = pb.PodSandboxStatus()
    ready.CopyFrom(sb)
    ready.state = pb.SANDBOX_READY  # stale: a not-ready sandbox never becomes ready again
    again = apply_event(pb.ContainerEventResponse(
        container_id="c4", container_event_type=pb.CONTAINER_STARTED_EVENT,
        pod_sandbox_status=ready), up.record, 4.0)
    assert again.record is not None
    assert again.record["sandboxes"][0]["state"] == "SANDBOX_NOTREADY" and again.fresh == {}


def test_a_created_container_is_published_when_its_hold_is_over() -> None:
    client, _clock, rel, stream = setup()
    sid, scfg = sandbox(client, "u1")
    cid = container(client, sid, scfg, "u1")
    rel.relist()
    take(stream)
    client.exit_container(cid, 1)
    new = container(client, sid, scfg, "u1", restarts=1, start=False)
    res = rel.apply_events(take(stream), 110.0)
    assert res.events == [] and res.changed == {}  # the death waits for the new container
    assert rel.flush(110.0 + HOLD / 2).events == []
    res = rel.flush(110.0 + HOLD)
    assert kinds(res) == [("u1", "ContainerDied", cid), ("u1", "ContainerChanged", new)]
    assert [c["state"] for c in res.changed["u1"]["containers"]] == [
        "CONTAINER_EXITED", "CONTAINER_CREATED"]
    assert res.ts == 110.0 + HOLD and res.changed["u1"]["ts"] == 110.0
    # once published, a CREATED container holds nothing back
    client.exit_container(new, 2)
    assert kinds(rel.apply_events(take(stream), 112.0)) == [("u1", "ContainerDied", new)]
    assert rel.held_until() is None


def test_a_relist_supersedes_held_updates() -> None:
    client, _clock, rel, stream = setup()
    rel.relist()
    sid, scfg = sandbox(client, "u1")
    cid = container(client, sid, scfg, "u1", start=False)
    assert rel.apply_events(take(stream), 100.5).events == []
    calls = len(client.method_calls("ContainerStatus"))
    res = rel.relist()
    assert ("u1", "ContainerChanged", cid) in kinds(res) and rel.held_until() is None
    assert len(client.method_calls("ContainerStatus")) == calls  # the event's status served
    assert rel.flush(200.0).events == []


def test_records_from_statuses_equal_records_from_listing_and_status() -> None:
    """An event's statuses render (``container_record_of_status``, ``sandbox_record(st, st)``)
    the same dicts as a relist's listing + status calls, in every state, with or without
    annotations."""
    client = FakeRuntimeClient()
    sid, scfg = sandbox(client, "u1")
    created = container(client, sid, scfg, "u1", "a", start=False)
    running = container(client, sid, scfg, "u1", "b")
    exited = container(client, sid, scfg, "u1", "c", restarts=2)
    client.exit_container(exited, 3)
    bare = client.create_container(sid, pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="d", attempt=4), image=pb.ImageSpec(image="i")),
        scfg)
    listed = {c.id: c for c in client.list_containers()}
    for cid in (created, running, exited, bare):
        st = client.container_status(cid)
        assert container_record_of_status(st, sid) == container_record(listed[cid], st)
    client.stop_pod_sandbox(sid)
    [sb] = client.list_pod_sandbox()
    st = client.pod_sandbox_status(sid)
    assert sandbox_record(st, st) == sandbox_record(sb, st)


def test_held_until_follows_the_oldest_held_pod() -> None:
    """``held_until`` (kept, not scanned for each call) is the oldest held pod's deadline as
    pods are held, published and superseded by a relist, in any order."""
    client, _clock, rel, stream = setup()
    rel.relist()
    pods = {}
    for uid in ("u1", "u2", "u3"):
        sid, scfg = sandbox(client, uid)
        pods[uid] = container(client, sid, scfg, uid, start=False)
    assert rel.held_until() is None
    events = take(stream)
    for ts, uid in ((100.0, "u2"), (100.2, "u1"), (100.4, "u3")):
        rel.apply_events([e for e in events if e.pod_sandbox_status.metadata.uid == uid], ts)
        assert rel.held_until() == 100.0 + HOLD
    client.start_container(pods["u2"])  # the oldest is published: the next one counts
    assert kinds(rel.apply_events(take(stream), 100.5))[0] == ("u2", "ContainerStarted",
                                                                pods["u2"])
    assert rel.held_until() == 100.2 + HOLD
    client.start_container(pods["u3"])  # a younger one leaves: the oldest still counts
    rel.apply_events(take(stream), 100.6)
    assert rel.held_until() == 100.2 + HOLD
    assert [e.pod_uid for e in rel.flush(100.2 + HOLD).events] == ["u1", "u1"]
    assert rel.held_until() is None
    sid, scfg = sandbox(client, "u4")
    container(client, sid, scfg, "u4", start=False)
    rel.apply_events(take(stream), 102.0)
    assert rel.held_until() == 102.0 + HOLD
    rel.relist()
    assert rel.held_until() is None
