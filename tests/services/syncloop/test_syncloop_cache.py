"""The sync loop's shared runtime listing, image presence memory, stop events and event skips
(unit tests over the CRI fake)."""

from __future__ import annotations

from cri_api.v1 import api_pb2 as pb

from podvisor.common import FakeClock
from podvisor.services.cri.fake import FakeRuntimeClient
from podvisor.services.pod import Pod, pod_from_dict
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.podcache import ImagePresence, RuntimeCache
from podvisor.services.syncloop.runtime_events import SeenStops, stopped_containers
from podvisor.services.syncloop.workers import Outcome, Timing, WorkerTable


def pod() -> Pod:
    return pod_from_dict({"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
                          "spec": {"containers": [{"name": "a", "image": "host",
                                                   "command": ["sleep", "100"]}]}}).pod


def _pod_in(cri: FakeRuntimeClient, uid: str, running: bool = True) -> str:
    labels = {L.POD_UID: uid}
    cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name=uid, namespace="d", uid=uid),
                              labels=labels)
    sid = cri.run_pod_sandbox(cfg)
    cid = cri.create_container(sid, pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="a"), image=pb.ImageSpec(image="host"),
        labels={**labels, L.CONTAINER_NAME: "a"}), cfg)
    if running:
        cri.start_container(cid)
    return cid


def _lists(cri: FakeRuntimeClient) -> int:
    return len(cri.method_calls("ListPodSandbox")) + len(cri.method_calls("ListContainers"))


def test_one_listing_serves_every_pod_newer_than_it() -> None:
    cri, clock = FakeRuntimeClient(), FakeClock(100.0)
    for uid in ("u1", "u2", "u3"):
        _pod_in(cri, uid)
    cache = RuntimeCache(cri, clock, lambda: 1000.0, max_age=5.0)
    never = lambda name, count: False  # noqa: E731
    rts = [cache.pod(uid, 99.0, never) for uid in ("u1", "u2", "u3", "nope")]
    assert _lists(cri) == 2                                   # one ListPodSandbox + ListContainers
    assert [len(rt.containers) for rt in rts] == [1, 1, 1, 0]
    assert not cri.method_calls("ContainerStatus")           # running: no status needed
    cache.pod("u1", 101.0, never)                              # newer than the listing: list again
    assert _lists(cri) == 4
    clock.now = 107.0
    cache.pod("u1", 0.0, never)                                # older than max_age: list again
    assert _lists(cri) == 6


def test_status_read_for_exited_and_for_back_off_rebuild_only() -> None:
    cri, clock = FakeRuntimeClient(), FakeClock(100.0)
    cid = _pod_in(cri, "u1")
    cri.exit_container(cid, 3)
    rt = RuntimeCache(cri, clock, lambda: 1000.0).pod("u1", 0.0, lambda n, c: False)
    assert rt.containers[0].exit_code == 3
    assert len(cri.method_calls("ContainerStatus")) == 1


def test_image_presence_is_remembered_for_its_ttl_only_when_present() -> None:
    cri, clock = FakeRuntimeClient(), FakeClock(100.0)
    images = ImagePresence(cri, clock, ttl=5.0)
    assert images.present("host") and images.present("host")
    assert len(cri.method_calls("ImageStatus")) == 1
    clock.now += 6
    assert images.present("host")
    assert len(cri.method_calls("ImageStatus")) == 2
    images.forget("host")
    assert images.present("host")
    assert len(cri.method_calls("ImageStatus")) == 3
    assert not images.present("missing") and not images.present("missing")
    assert len(cri.method_calls("ImageStatus")) == 5


def test_stopped_containers_and_seen_stops() -> None:
    status = pb.ContainerStatus(id="c1", labels={L.POD_UID: "u1"})
    ev = pb.ContainerEventResponse
    events = [
        ev(container_id="c0", container_event_type=pb.CONTAINER_STARTED_EVENT,
           containers_statuses=[status]),
        None,
        ev(container_id="c1", container_event_type=pb.CONTAINER_STOPPED_EVENT,
           containers_statuses=[status]),
        ev(container_id="c2", container_event_type=pb.CONTAINER_STOPPED_EVENT),
    ]
    assert stopped_containers(events) == [("u1", "c1")]
    seen = SeenStops(size=2)
    for cid in ("a", "b", "c"):
        seen.add(cid)
    assert "a" not in seen and "b" in seen and "c" in seen


def test_trigger_older_than_the_last_read_is_dropped_and_triggers_read_fresh() -> None:
    t = WorkerTable(Timing(resync=60), rand=lambda: 0.0)
    t.update(pod(), "file", 0.0)
    [first] = t.due(0.0)
    assert first.newer_than == 0.0                 # a new pod may use a shared listing
    t.finish(first, Outcome(ok=True), 1.0)
    t.trigger("u1", 2.0, seen_at=2.0)
    [fresh] = t.due(2.0)
    assert fresh.newer_than is None                # the runtime changed: read it fresh
    t.trigger("u1", 2.5, seen_at=1.5)              # a relist from before that read
    t.finish(fresh, Outcome(ok=True), 3.0)
    assert t.due(3.0) == []
    [resync] = t.due(63.0)
    assert resync.newer_than == 3.0                # a resync: any listing since the last sync
