"""Relister over the FakeRuntimeClient: grouping, inspection, records, re-inspection."""

from __future__ import annotations

import grpc
from cri_api.v1 import api_pb2 as pb

from podvisor.common import FakeClock
from podvisor.services.cri.fake import FakeRuntimeClient
from podvisor.services.pleg.events import EventType
from podvisor.services.pleg.relist import new_relister


def labels(uid: str, name: str = "web", container: str | None = None) -> dict[str, str]:
    out = {"io.kubernetes.pod.uid": uid, "io.kubernetes.pod.name": name,
           "io.kubernetes.pod.namespace": "default"}
    if container is not None:
        out["io.kubernetes.container.name"] = container
    return out


def sandbox(
    client: FakeRuntimeClient, uid: str, name: str = "web"
) -> tuple[str, pb.PodSandboxConfig]:
    cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace="default", uid=uid, attempt=0),
        labels=labels(uid, name))
    return client.run_pod_sandbox(cfg), cfg


def container(client: FakeRuntimeClient, sid: str, scfg: pb.PodSandboxConfig, uid: str,
              name: str = "app", restarts: int = 0, start: bool = True) -> str:
    cfg = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=name, attempt=restarts),
        image=pb.ImageSpec(image="host"), labels=labels(uid, container=name),
        annotations={"io.kubernetes.container.hash": "h1",
                     "io.kubernetes.container.restartCount": str(restarts)},
        log_path=f"{name}/{restarts}.log")
    cid = client.create_container(sid, cfg, scfg)
    if start:
        client.start_container(cid)
    return cid


def kinds(result: object) -> list[tuple[str, str, str]]:
    return [(e.pod_uid, e.type.value, e.container_id) for e in result.events]  # type: ignore[attr-defined]


def test_new_pod_is_started_inspected_and_recorded() -> None:
    client, clock = FakeRuntimeClient(), FakeClock(100.0)
    sid, scfg = sandbox(client, "u1")
    cid = container(client, sid, scfg, "u1")
    rel = new_relister(client, clock)
    res = rel.relist()
    assert kinds(res) == [("u1", "ContainerStarted", cid), ("u1", "ContainerStarted", sid)]
    rec = res.changed["u1"]
    assert rec["ts"] == 100.0 and rec["name"] == "web" and rec["namespace"] == "default"
    assert rec["sandboxes"][0]["id"] == sid and rec["sandboxes"][0]["state"] == "SANDBOX_READY"
    # the pod network sandbox's IPs from PodSandboxStatus (the fake's 10.88.0.0/16)
    assert rec["sandboxes"][0]["ip"] == client.pod_sandbox_status(sid).network.ip != ""
    assert rec["sandboxes"][0]["additional_ips"] == []
    c = rec["containers"][0]
    assert c["id"] == cid and c["name"] == "app" and c["sandbox_id"] == sid
    assert c["state"] == "CONTAINER_RUNNING" and c["started_at"] > 0 and c["hash"] == "h1"
    assert c["restart_count"] == 0 and c["image"] == "host" and c["log_path"] == "app/0.log"
    assert res.removed == [] and rel.records() == {"u1": rec}


def test_quiet_relist_changes_nothing_and_inspects_nothing() -> None:
    client, clock = FakeRuntimeClient(), FakeClock(100.0)
    sid, scfg = sandbox(client, "u1")
    container(client, sid, scfg, "u1")
    rel = new_relister(client, clock)
    rel.relist()
    before = len(client.method_calls("ContainerStatus"))
    clock.now = 101.0
    res = rel.relist()
    assert res.events == [] and res.changed == {} and res.removed == []
    assert len(client.method_calls("ContainerStatus")) == before
    assert rel.records()["u1"]["ts"] == 100.0


def test_death_reports_exit_code_and_new_ts() -> None:
    client, clock = FakeRuntimeClient(), FakeClock(100.0)
    sid, scfg = sandbox(client, "u1")
    cid = container(client, sid, scfg, "u1")
    rel = new_relister(client, clock)
    rel.relist()
    client.exit_container(cid, 3)
    clock.now = 101.0
    res = rel.relist()
    assert kinds(res) == [("u1", "ContainerDied", cid)]
    c = res.changed["u1"]["containers"][0]
    assert c["state"] == "CONTAINER_EXITED" and c["exit_code"] == 3 and c["reason"] == "Error"
    assert c["finished_at"] > 0 and res.changed["u1"]["ts"] == 101.0


def test_removed_pod_is_deleted() -> None:
    client, clock = FakeRuntimeClient(), FakeClock(100.0)
    sid, scfg = sandbox(client, "u1")
    cid = container(client, sid, scfg, "u1")
    rel = new_relister(client, clock)
    rel.relist()
    client.stop_pod_sandbox(sid)
    client.remove_pod_sandbox(sid)
    res = rel.relist()
    assert kinds(res) == [("u1", "ContainerDied", cid), ("u1", "ContainerRemoved", cid),
                          ("u1", "ContainerDied", sid), ("u1", "ContainerRemoved", sid)]
    assert res.removed == ["u1"] and rel.records() == {}


def test_foreign_containers_are_ignored_and_pods_grouped() -> None:
    client, clock = FakeRuntimeClient(), FakeClock(100.0)
    client.run_pod_sandbox(pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="x")))
    s1, c1 = sandbox(client, "u1", "a")
    s2, c2 = sandbox(client, "u2", "b")
    container(client, s1, c1, "u1", "one")
    container(client, s1, c1, "u1", "two")
    container(client, s2, c2, "u2", "three")
    res = new_relister(client, clock).relist()
    assert sorted(res.changed) == ["u1", "u2"]
    assert [c["name"] for c in res.changed["u1"]["containers"]] == ["one", "two"]
    assert [c["name"] for c in res.changed["u2"]["containers"]] == ["three"]


def test_list_failure_raises_and_keeps_state() -> None:
    client, clock = FakeRuntimeClient(), FakeClock(100.0)
    sid, scfg = sandbox(client, "u1")
    container(client, sid, scfg, "u1")
    rel = new_relister(client, clock)
    rel.relist()
    client.fail("ListContainers", times=1)
    try:
        rel.relist()
    except Exception as err:
        assert "ListContainers" in str(err)
    else:
        raise AssertionError("relist should fail")
    assert rel.relist().events == []  # the failed relist did not forget anything


def test_failed_inspection_is_retried_next_relist() -> None:
    client, clock = FakeRuntimeClient(), FakeClock(100.0)
    sid, scfg = sandbox(client, "u1")
    cid = container(client, sid, scfg, "u1")
    client.fail("ContainerStatus", grpc.StatusCode.DEADLINE_EXCEEDED, times=1)
    rel = new_relister(client, clock)
    res = rel.relist()
    assert res.incomplete == ["u1"]
    partial = res.changed["u1"]["containers"][0]
    assert partial["state"] == "CONTAINER_RUNNING" and partial["started_at"] == 0
    clock.now = 101.0
    res = rel.relist()
    assert res.events == [] and res.incomplete == []
    assert res.changed["u1"]["containers"][0]["started_at"] > 0
    assert res.changed["u1"]["containers"][0]["id"] == cid


def test_heartbeat_runs_between_cri_calls() -> None:
    client, clock = FakeRuntimeClient(), FakeClock(100.0)
    sid, scfg = sandbox(client, "u1")
    container(client, sid, scfg, "u1")
    container(client, sid, scfg, "u1", "side")
    beats: list[int] = []
    new_relister(client, clock, lambda: beats.append(1)).relist()
    assert len(beats) >= 5  # after each list and before each of the three inspections


def test_created_container_is_changed_then_started() -> None:
    client, clock = FakeRuntimeClient(), FakeClock(100.0)
    sid, scfg = sandbox(client, "u1")
    cid = container(client, sid, scfg, "u1", start=False)
    rel = new_relister(client, clock)
    assert ("u1", EventType.CONTAINER_CHANGED.value, cid) in kinds(rel.relist())
    client.start_container(cid)
    assert kinds(rel.relist()) == [("u1", "ContainerStarted", cid)]


def test_only_objects_whose_state_changed_are_inspected_again() -> None:
    client, clock = FakeRuntimeClient(), FakeClock(100.0)
    sid, scfg = sandbox(client, "u1")
    first = container(client, sid, scfg, "u1", "one")
    rel = new_relister(client, clock)
    rel.relist()
    sandbox_calls = len(client.method_calls("PodSandboxStatus"))
    calls = len(client.method_calls("ContainerStatus"))
    second = container(client, sid, scfg, "u1", "two", start=False)
    clock.now = 101.0
    res = rel.relist()
    assert [c["id"] for c in res.changed["u1"]["containers"]] == [first, second]
    assert [args[0] for args in client.method_calls("ContainerStatus")[calls:]] == [second]
    assert len(client.method_calls("PodSandboxStatus")) == sandbox_calls
    client.start_container(second)
    clock.now = 102.0
    res = rel.relist()
    assert res.changed["u1"]["containers"][1]["state"] == "CONTAINER_RUNNING"
    assert res.changed["u1"]["containers"][1]["started_at"] > 0
