"""Image GC and container GC rules (services/imagegc/gc.py) with plain values and the fake CRI
runtime: thresholds, LRU order, minimum age, in-use and pinned images never removed, the
short-of-space event and metric; one dead container kept per pod container, none and no dead
sandbox for removed pods."""

from __future__ import annotations

from typing import Any

from cri_api.v1 import api_pb2 as pb

from podvisor.common.logs import MemoryLogger
from podvisor.services.cri.fake import FakeRuntimeClient
from podvisor.services.imagegc import ImageTracker, Usage, plan_container_gc, plan_image_gc
from podvisor.services.imagegc.service import EventSink, ImageGC


def img(i: str, size: int, pinned: bool = False) -> pb.Image:
    return pb.Image(id=f"sha256:{i}", repo_tags=[f"r/{i}:1"], size=size, pinned=pinned)


def test_lru_down_to_low_threshold_never_in_use_pinned_or_young() -> None:
    images = [img("a", 100), img("b", 100), img("c", 100), img("d", 100, pinned=True),
              img("e", 100), img("young", 100)]
    t = ImageTracker()
    t.detect(images[:5], set(), now=0.0)
    t.detect(images, set(), now=50.0)  # "young" first seen later
    t.records["sha256:a"].last_used = 30.0
    t.records["sha256:b"].last_used = 10.0
    t.records["sha256:c"].last_used = 20.0
    in_use = {"r/e:1"}  # by tag
    usage = Usage(capacity=1000, used=950)  # 95 % >= 85: free down to 80 %: 150 bytes
    plan = plan_image_gc(images, t, in_use, usage, 85, 80, min_age=30.0, now=60.0)
    assert [i.id for i in plan.remove] == ["sha256:b", "sha256:c"]  # oldest use first
    assert plan.to_free == 150 and plan.can_free == 200
    assert plan_image_gc(images, t, in_use, Usage(1000, 840), 85, 80, 30.0, 60.0).remove == []


def test_short_of_space_event_and_metric_and_removal(tmp_path: Any) -> None:
    cri = FakeRuntimeClient()
    cri.images.update({"sha256:a": img("a", 100), "sha256:b": img("b", 100)})  # by id
    # "a" is used by a container (running or exited); only "b" can go
    sid = cri.run_pod_sandbox(pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(
        name="p", namespace="d", uid="u1"), labels={"io.kubernetes.pod.uid": "u1"}))
    cri.create_container(sid, pb.ContainerConfig(metadata=pb.ContainerMetadata(name="c"),
                                                 image=pb.ImageSpec(image="r/a:1")),
                         pb.PodSandboxConfig())
    events: list[tuple[str, str, str]] = []
    log = MemoryLogger()
    gc = ImageGC(cri, lambda: Usage(1000, 950), log,
                 EventSink(lambda t, r, m, o: events.append((t, r, m)), lambda: None),
                 "node", 85, 80, 0.0, tmp_path / "imagegc.prom")
    gc.step(0.0, {}, None)
    assert [i.id for i in cri.list_images()] == ["sha256:a"]
    assert events and events[0][1] == "FreeDiskSpaceFailed"
    assert "Attempted to free 150 bytes, but only found 100 bytes" in events[0][2]
    text = (tmp_path / "imagegc.prom").read_text()
    assert "podvisor_image_gc_failures_total 1.0" in text
    assert "podvisor_image_gc_freed_bytes_total 100.0" in text


def ctr(cid: str, uid: str, name: str, state: int, created: int, sandbox: str = "s1"
        ) -> pb.Container:
    return pb.Container(id=cid, pod_sandbox_id=sandbox, state=state, created_at=created,
                        metadata=pb.ContainerMetadata(name=name),
                        labels={"io.kubernetes.pod.uid": uid,
                                "io.kubernetes.container.name": name})


def box(sid: str, uid: str, ready: bool, created: int) -> pb.PodSandbox:
    return pb.PodSandbox(id=sid, created_at=created,
                         state=pb.SANDBOX_READY if ready else pb.SANDBOX_NOTREADY,
                         metadata=pb.PodSandboxMetadata(name="p", namespace="d", uid=uid),
                         labels={"io.kubernetes.pod.uid": uid})


def test_container_gc_keeps_one_dead_per_container_and_clears_removed_pods() -> None:
    E, R = pb.CONTAINER_EXITED, pb.CONTAINER_RUNNING
    containers = [ctr("r", "u1", "app", R, 50), ctr("d1", "u1", "app", E, 40),
                  ctr("d2", "u1", "app", E, 30), ctr("d3", "u1", "app", E, 20),
                  ctr("o1", "u1", "side", E, 10),
                  ctr("g1", "gone", "app", E, 5, "s9"), ctr("g2", "gone", "app", E, 6, "s9")]
    sandboxes = [box("s1", "u1", True, 10), box("s0", "u1", False, 5),
                 box("s9", "gone", False, 1), box("s8", "gone2", False, 1)]
    plan = plan_container_gc(containers, sandboxes, {"u1"})
    assert sorted(c.id for c in plan.containers) == ["d2", "d3", "g1", "g2"]
    assert sorted(s.id for s in plan.sandboxes) == ["s0", "s8", "s9"]
    # the desired set unknown: only the per-container rule, no sandbox judged removed
    plan = plan_container_gc(containers, sandboxes, None)
    assert sorted(c.id for c in plan.containers) == ["d2", "d3", "g1"]
    assert sorted(s.id for s in plan.sandboxes) == ["s0"]


class Reopener:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.reopened: list[str] = []

    def reopen_container_log(self, cid: str) -> None:
        from podvisor.services.cri import CriError
        if self.fail:
            import grpc
            raise CriError("ReopenContainerLog", grpc.StatusCode.NOT_FOUND, "gone")
        self.reopened.append(cid)


def test_log_rotation_gzips_all_but_newest_and_keeps_max_files(tmp_path: Any) -> None:
    import gzip

    import pytest

    from podvisor.cli.ctl_logs import tail_lines
    from podvisor.common.crilog import with_rotated
    from podvisor.services.cri import CriError
    from podvisor.services.imagegc.logrotate import rotate_log, rotated_files

    log = tmp_path / "0.log"
    cri: Any = Reopener()
    for i in range(5):  # five rotations, max 3 files: live + newest rotated + one gzipped
        log.write_bytes(f"2024-01-01T00:00:0{i}Z stdout F line{i}\n".encode() * 10)
        assert rotate_log(cri, "c1", log, 100, 3, f"2024010{i}-000000")
        log.write_bytes(f"2024-01-01T00:00:1{i}Z stdout F live{i}\n".encode())
    names = [p.name for p in rotated_files(log)]
    assert names == ["0.log.20240103-000000.gz", "0.log.20240104-000000"]
    assert gzip.decompress((tmp_path / names[0]).read_bytes()).startswith(b"2024-01-01T")
    assert cri.reopened == ["c1"] * 5
    assert not rotate_log(cri, "c1", log, 100, 3, "20240109-000000")  # under the limit
    # reading across the rotation: gzipped, rotated, live, oldest first
    lines = tail_lines(with_rotated(log), None)
    assert lines[0] == b"line3\n" and lines[-2:] == [b"line4\n", b"live4\n"]
    # a failed reopen puts the file back
    log.write_bytes(b"x" * 200)
    with pytest.raises(CriError):
        rotate_log(Reopener(fail=True), "c1", log, 100, 3, "20240110-000000")
    assert log.read_bytes() == b"x" * 200


def test_rotation_pass_reads_running_containers_from_pleg_records(tmp_path: Any) -> None:
    """The pass takes running containers and their log paths from PLEG's records: the only CRI
    call is ReopenContainerLog of a rotated file (no listing, no status per container)."""
    from podvisor.common.logs import MemoryLogger
    from podvisor.services.imagegc.logrotate import rotate_pass
    from tests.support.plegs import pleg_map

    big, small, dead = (tmp_path / n for n in ("big.log", "small.log", "dead.log"))
    big.write_bytes(b"x" * 500)
    small.write_bytes(b"x" * 10)
    dead.write_bytes(b"x" * 500)
    pleg = pleg_map({
        "_health": {"relists": 1},
        "u1": {"name": "web", "namespace": "default", "containers": [
            {"id": "c1", "name": "a", "state": "CONTAINER_RUNNING", "log_path": str(big)},
            {"id": "c2", "name": "b", "state": "CONTAINER_RUNNING", "log_path": str(small)},
            {"id": "c3", "name": "c", "state": "CONTAINER_EXITED", "log_path": str(dead)},
            {"id": "c4", "name": "d", "state": "CONTAINER_RUNNING", "log_path": ""}]}})
    cri: Any = Reopener()  # has nothing but reopen_container_log: any other call would fail
    log = MemoryLogger()
    assert rotate_pass(cri, pleg, 100, 3, "20240101-000000", log) == 1
    assert cri.reopened == ["c1"] and not big.exists() and dead.stat().st_size == 500
    [event] = [e for e in log.events if e["event"] == "imagegc.log.rotated"]
    assert (event["pod"], event["pod_uid"], event["container"]) == ("web_default", "u1", "a")


def test_pull_progress_lines(tmp_path: Any, capsys: Any) -> None:
    """`images pull` on a terminal: one line per layer, redrawn in place."""
    import hashlib
    import json

    from podvisor.cli.ctl_images import _Progress, format_images

    ref = "127.0.0.1:5000/a:1"
    name = hashlib.sha256(ref.encode()).hexdigest()[:24] + ".json"
    (tmp_path / name).write_text(json.dumps({"ref": ref, "layers": {
        "sha256:" + "a" * 64: {"phase": "downloading", "done": 1500, "total": 3000000},
        "sha256:" + "b" * 64: {"phase": "exists", "done": 10, "total": 10}}}))
    bar = _Progress(tmp_path, ref)
    bar.draw()
    bar.draw()
    out = capsys.readouterr().out
    assert "aaaaaaaaaaaa: Downloading 1.5kB/3MB\n" in out
    assert "bbbbbbbbbbbb: Already exists\n" in out
    assert out.count("\x1b[F") == 2  # the second draw moved up over the two lines
    table = format_images([{"id": "sha256:" + "c" * 64, "repoTags": ["r.local:5000/x:1"],
                            "size": 1234567}])
    assert table.splitlines()[1].split() == ["r.local:5000/x", "1", "c" * 13, "1.23MB"]


def test_step_deadline_includes_the_next_rotation_when_it_is_not_due(tmp_path: Any) -> None:
    """The step's answer is its next due time: the rotation's too, on the turns between
    rotations (a step that did not rotate once answered the next GC, a minute away)."""
    from podvisor.services.imagegc.logrotate import ROTATE_PERIOD

    gc = ImageGC(FakeRuntimeClient(), lambda: Usage(1000, 10), MemoryLogger(),
                 EventSink(lambda t, r, m, o: None, lambda: None), "node", 85, 80, 0.0)
    gc.log_limits = (100, 3)
    assert gc.step(0.0, {}, None) == ROTATE_PERIOD  # rotated now; GC is a minute away
    assert gc.step(1.0, {}, None) == ROTATE_PERIOD  # not due: still the rotation's time
    gc.log_limits = None
    assert gc.step(2.0, {}, None) == gc.next_container_gc


def test_reclaim_for_eviction_removes_every_dead_container_of_terminated_pods() -> None:
    """The kubelet's ``DeleteAllUnusedContainers`` (the eviction manager's reclaim): a
    terminated pod keeps no dead container nor dead sandbox; a running pod keeps its newest
    dead one per container as always."""
    E, R = pb.CONTAINER_EXITED, pb.CONTAINER_RUNNING
    containers = [ctr("r", "u1", "app", R, 50), ctr("d1", "u1", "app", E, 40),
                  ctr("d2", "u1", "app", E, 30),
                  ctr("t1", "done", "app", E, 20, "s5"), ctr("t2", "done", "app", E, 10, "s5")]
    sandboxes = [box("s1", "u1", True, 10), box("s5", "done", False, 5)]
    plan = plan_container_gc(containers, sandboxes, {"u1", "done"})
    assert sorted(c.id for c in plan.containers) == ["d2", "t2"]
    assert plan.sandboxes == []
    plan = plan_container_gc(containers, sandboxes, {"u1", "done"}, terminated={"done"})
    assert sorted(c.id for c in plan.containers) == ["d2", "t1", "t2"]
    assert [s.id for s in plan.sandboxes] == ["s5"]


def test_reclaim_removes_unused_containers_then_every_unused_image_and_answers_once(
        tmp_path: Any) -> None:
    """``ImageGC.reclaim``: the dead container of a terminated pod goes, then every unused
    image whatever the usage (not one in use, pinned or younger than the minimum age); the
    answer names the request, and the same request again is answered, not redone."""
    from podvisor.ipc.messages import ReclaimNodeResources

    cri = FakeRuntimeClient()
    cri.images.update({"sha256:a": img("a", 100), "sha256:b": img("b", 200),
                       "sha256:c": img("c", 300, pinned=True)})
    sid = cri.run_pod_sandbox(pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(
        name="p", namespace="d", uid="done"), labels={"io.kubernetes.pod.uid": "done"}))
    cid = cri.create_container(sid, pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="c"), image=pb.ImageSpec(image="r/a:1"),
        labels={"io.kubernetes.pod.uid": "done", "io.kubernetes.container.name": "c"}),
        pb.PodSandboxConfig())
    cri.start_container(cid)
    cri.stop_container(cid, 0)
    cri.stop_pod_sandbox(sid)
    gc = ImageGC(cri, lambda: Usage(1000, 10), MemoryLogger(),  # 1 %: no threshold met
                 EventSink(lambda t, r, m, o: None, lambda: None), "node", 85, 80, 0.0,
                 tmp_path / "imagegc.prom")
    request = ReclaimNodeResources(id="r1", signal="nodefs.available")
    answer = gc.reclaim(5.0, request, {}, {"done"}, {"done"})
    assert (answer.id, answer.containers, answer.sandboxes) == ("r1", 1, 1)
    # a, b and the fake's own "host" image (size 0); c is pinned
    assert (answer.images, answer.image_bytes, answer.errors) == (3, 300, "")
    assert [i.id for i in cri.list_images()] == ["sha256:c"]  # pinned stays
    assert cri.list_containers() == []
    assert gc.reclaim(6.0, request, {}, {"done"}, {"done"}) is answer
