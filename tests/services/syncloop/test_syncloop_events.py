"""The restart fast path: a CONTAINER_STOPPED event of the sync loop's own stream is the pod's
runtime state for the sync it triggers (no ListPodSandbox/ListContainers/ContainerStatus), when
that is safe; otherwise the sync reads the runtime as before (unit tests over the CRI fake)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from cri_api.v1 import api_pb2 as pb

from podvisor.common.logs import MemoryLogger
from podvisor.services.cri.fake import FakeEventStream, FakeRuntimeClient
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.backoff import BackoffPolicy, CrashBackoff, SharedBackoff
from podvisor.services.syncloop.loop import LoopDeps, SyncLoop
from podvisor.services.syncloop.podcache import RuntimeCache
from podvisor.services.syncloop.podconfig import new_pod_config
from podvisor.services.syncloop.runtime_events import (
    Effect,
    EventSnapshot,
    event_mono,
    pod_events,
    runtime_from_event,
)
from podvisor.services.syncloop.runtime_state import ContainerState
from podvisor.services.syncloop.syncpod import SyncDeps
from podvisor.services.syncloop.workers import Timing, WorkerTable
from tests.services.syncloop.test_podworkers import Desired, published

READS = ("ListPodSandbox", "ListContainers", "ContainerStatus")


def manifest(uid: str = "u1", names: tuple[str, ...] = ("a", "b"),
             **spec: Any) -> dict[str, Any]:
    return published({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p-" + uid, "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": n, "image": "host", "command": ["sleep", "100"]}
                                    for n in names], **spec}})


class Harness:
    """A SyncLoop over the fake with inline work; ``events`` is the loop's own stream."""

    def __init__(self, tmp: Path) -> None:
        self.now = 100.0
        self.cri = FakeRuntimeClient(clock=lambda: int((1e9 + self.now) * 1e9))
        self.log = MemoryLogger()
        self.sync = SyncDeps(
            cri=self.cri, pods_dir=tmp / "pods", pod_logs_dir=tmp / "pod-logs",
            backoff=SharedBackoff(CrashBackoff(BackoffPolicy(0, 0, 600))),
            image_backoff=SharedBackoff(CrashBackoff(BackoffPolicy(1, 4, 600))),
            mono=lambda: self.now, wall=lambda: 1e9 + self.now, log=self.log,
            sleep=lambda s: None,
            cache=RuntimeCache(self.cri, lambda: self.now, lambda: 1e9 + self.now))

        def run_inline(fn: Callable[[], None]) -> None:
            fn()

        self.loop = SyncLoop(LoopDeps(
            sync=self.sync, pod_config=new_pod_config(("file",)),
            table=WorkerTable(Timing(), rand=lambda: 0.0), desired=Desired(),
            submit=run_inline, wake=lambda: None, housekeeping_interval=1e9))
        self.stream: FakeEventStream = self.cri.container_events()
        self.mark = 0

    def settle(self, rounds: int = 4) -> None:
        for _ in range(rounds):
            self.loop.step(self.now)

    def set(self, *pods: dict[str, Any]) -> None:
        self.loop.handle_pod_set("file", list(pods), self.now)
        self.settle()

    def events(self) -> list[tuple[str, pb.ContainerEventResponse]]:
        out = []
        while not self.stream.queue.empty():
            out.append(self.stream.queue.get_nowait())
        return pod_events(out)

    def deliver(self, events: list[tuple[str, pb.ContainerEventResponse]]) -> None:
        """As main.py: every event of the stream, in order, then a step."""
        for uid, event in events:
            self.loop.handle_container_event(uid, event, self.now,
                                             event_mono(event, self.now, 1e9 + self.now))
        self.settle()

    def running(self, uid: str = "u1") -> dict[str, str]:
        return {c.labels[L.CONTAINER_NAME]: c.id for c in self.cri.list_containers()
                if c.state == pb.CONTAINER_RUNNING and c.labels[L.POD_UID] == uid}

    def calls_since_mark(self) -> list[str]:
        return [name for name, _ in self.cri.calls[self.mark:]]

    def set_mark(self) -> None:
        self.mark = len(self.cri.calls)


def started(tmp: Path, **kw: Any) -> Harness:
    h = Harness(tmp)
    h.set(manifest(**kw))
    assert set(h.running()) == {"a", "b"}
    h.events()  # the start's own events
    h.now += 1
    return h


def test_a_stopped_container_restarts_from_the_event_alone(tmp_path: Path) -> None:
    h = started(tmp_path)
    old = h.running()["a"]
    h.set_mark()
    h.cri.exit_container(old, 137)
    h.deliver(h.events())
    assert h.calls_since_mark() == ["PullImage", "CreateContainer", "StartContainer"]
    new = h.running()["a"]
    assert new != old
    [line] = [x for x in h.log.events if x.get("event") == "syncloop.container.started"
              and x.get("container_id") == new]
    assert line["state_from_event"] is True and line["restart_count"] == 1
    # and again: the last sync's start shows in the next event
    h.events()
    h.now += 1
    h.set_mark()
    h.cri.exit_container(new, 137)
    h.deliver(h.events())                   # the first dead one goes (one dead kept per name)
    assert h.calls_since_mark() == ["RemoveContainer", "PullImage", "CreateContainer",
                                    "StartContainer"]
    assert old not in h.cri.containers
    assert h.running()["a"] not in (old, new)


def test_a_later_event_of_the_pod_replaces_the_pending_one(tmp_path: Path) -> None:
    h = started(tmp_path)
    a, b = h.running()["a"], h.running()["b"]
    h.cri.exit_container(a, 1)
    h.cri.exit_container(b, 1)
    h.set_mark()
    h.deliver(h.events())                   # two stops, one sync: from the second's state
    assert not set(h.calls_since_mark()) & set(READS)
    assert h.calls_since_mark().count("StartContainer") == 2
    assert set(h.running()) == {"a", "b"}


def test_events_published_out_of_order_are_not_trusted(tmp_path: Path) -> None:
    h = started(tmp_path)
    a, b = h.running()["a"], h.running()["b"]
    h.cri.exit_container(a, 1)
    first = h.events()                      # shows b running
    h.cri.exit_container(b, 1)
    second = h.events()
    h.set_mark()
    h.deliver(second + first)               # the last one delivered misses b's stop
    assert h.calls_since_mark()[:2] == ["ListPodSandbox", "ListContainers"]
    assert set(h.running()) == {"a", "b"}


def test_a_stop_the_last_fresh_read_saw_syncs_nothing(tmp_path: Path) -> None:
    h = started(tmp_path)
    h.cri.exit_container(h.running()["a"], 1)
    h.now += 0.5
    late = h.events()
    h.loop.handle_pleg_event("u1", h.now)   # PLEG's ContainerDied came first: a fresh read
    h.settle()
    h.events()
    h.set_mark()
    h.deliver(late)                         # the stream's, later: old news
    assert h.calls_since_mark() == []


def test_an_event_older_than_the_last_sync_is_not_acted_on(tmp_path: Path) -> None:
    h = started(tmp_path)
    a, b = h.running()["a"], h.running()["b"]
    h.cri.exit_container(a, 1)
    stale = h.events()                      # the stop of a: state before a's restart
    h.loop.handle_pleg_event("u1", h.now)   # PLEG reported it first: a fresh read restarts a
    h.settle()
    assert set(h.running()) == {"a", "b"} and h.running()["a"] != a
    h.events()
    h.now += 1
    h.cri.exit_container(b, 1)
    later = h.events()
    h.set_mark()
    h.deliver(stale)                        # late: its state misses a's replacement
    assert h.calls_since_mark()[:2] == ["ListPodSandbox", "ListContainers"]
    assert h.calls_since_mark().count("CreateContainer") == 1   # b only, a not twice
    names = [c.labels[L.CONTAINER_NAME] for c in h.cri.list_containers()
             if c.state == pb.CONTAINER_RUNNING]
    assert sorted(names) == ["a", "b"]
    h.events()
    h.set_mark()
    h.deliver(later)                        # b's stop: already handled by that read
    assert "CreateContainer" not in h.calls_since_mark()


def test_anything_else_asking_for_the_sync_reads_the_runtime(tmp_path: Path) -> None:
    h = started(tmp_path)
    h.cri.exit_container(h.running()["a"], 1)
    events = h.events()
    for uid, event in events:
        h.loop.handle_container_event(uid, event, h.now)
    h.loop.handle_pleg_event("u1", h.now)   # a probe verdict or PLEG event coalesces
    h.set_mark()
    h.settle()
    assert h.calls_since_mark()[:2] == ["ListPodSandbox", "ListContainers"]
    assert set(h.running()) == {"a", "b"}
    # a source update coalescing with a stop: read as well
    h.events()
    h.now += 1
    h.cri.exit_container(h.running()["b"], 1)
    for uid, event in h.events():
        h.loop.handle_container_event(uid, event, h.now)
    h.loop.handle_pod_set("file", [manifest(names=("a", "b"))], h.now)
    m = manifest()
    m["metadata"]["labels"] = {"x": "y"}
    h.loop.handle_pod_set("file", [m], h.now)
    h.set_mark()
    h.settle()
    assert "ListContainers" in h.calls_since_mark()
    assert set(h.running()) == {"a", "b"}


def test_periodic_resync_and_error_retry_read_as_before(tmp_path: Path) -> None:
    h = started(tmp_path)
    h.now += 100                            # due for its resync: the shared listing
    h.set_mark()
    h.settle()
    assert h.calls_since_mark() == ["ListPodSandbox", "ListContainers"]
    h.cri.fail("CreateContainer", times=1)
    h.cri.exit_container(h.running()["a"], 1)
    h.set_mark()
    h.deliver(h.events())                   # from the event, but the create fails
    assert h.calls_since_mark()[:2] == ["PullImage", "CreateContainer"]
    assert set(h.running()) == {"b"}
    h.now += 30                             # the error retry reads fresh
    h.set_mark()
    h.settle()
    assert h.calls_since_mark()[:2] == ["ListPodSandbox", "ListContainers"]
    assert set(h.running()) == {"a", "b"}


def _event(h: Harness, cid: str) -> pb.ContainerEventResponse:
    return [e for _, e in h.events() if e.container_id == cid
            and e.container_event_type == pb.CONTAINER_STOPPED_EVENT][-1]


def test_runtime_from_event_checks(tmp_path: Path) -> None:
    h = started(tmp_path)
    a, b = h.running()["a"], h.running()["b"]
    sid = h.loop.deps.table.workers["u1"].sandbox_id
    assert sid
    h.cri.exit_container(a, 2)
    event = _event(h, a)
    names = ("a", "b")

    def check(snap: EventSnapshot, names: tuple[str, ...] = names) -> str:
        return runtime_from_event(snap, names, h.now, 1e9 + h.now)[1]

    rt, why = runtime_from_event(EventSnapshot(event, sid, {}), names, h.now, 1e9 + h.now)
    assert rt is not None and why == ""
    assert [s.id for s in rt.sandboxes] == [sid] and rt.sandboxes[0].ready
    latest = rt.latest("a")
    assert latest is not None and latest.state is ContainerState.EXITED
    assert latest.exit_code == 2 and latest.finished_at == h.now and latest.sandbox_id == sid
    assert check(EventSnapshot(event, "other", {})) == "not the current sandbox"
    assert check(EventSnapshot(event, None, {})) == "not the current sandbox"
    assert check(EventSnapshot(event, sid, {}), ("a", "b", "c")) == \
        "a container of the spec is missing"
    assert check(EventSnapshot(event, sid, {"gone": Effect.STARTED})) == \
        "older than the last sync"
    assert check(EventSnapshot(event, sid, {b: Effect.STOPPED})) == "older than the last sync"
    assert check(EventSnapshot(event, sid, {a: Effect.REMOVED})) == "older than the last sync"
    assert check(EventSnapshot(event, sid, {a: Effect.STOPPED, "x": Effect.REMOVED})) == ""
    assert check(EventSnapshot(pb.ContainerEventResponse(container_id=a), sid, {})) == \
        "no sandbox status"
    h.cri.stop_pod_sandbox(sid)
    h.cri.exit_container(b, 0)
    assert check(EventSnapshot(_event(h, b), sid, {})) == "sandbox not ready"


def test_a_new_sandbox_is_read_not_taken_from_the_old_sandbox_event(tmp_path: Path) -> None:
    h = started(tmp_path, restartPolicy="Never")
    a, b = h.running()["a"], h.running()["b"]
    h.cri.exit_container(a, 0)
    h.cri.exit_container(b, 0)
    h.set_mark()
    h.deliver(h.events())                   # both done, policy Never: the pod is finished
    assert "CreateContainer" not in h.calls_since_mark()
    assert not h.running()
