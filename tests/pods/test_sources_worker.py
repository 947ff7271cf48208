"""The helper-thread plumbing of the source processes, and the file parse cache."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from podvisor.services.sources.common import FirstSeen
from podvisor.services.sources.files import ParseCache, read_static_pods
from podvisor.services.sources.worker import LoopWorker, Progress, WorkerStalled, run_in_thread

POD = ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n"
       "  - name: c\n    image: host\n")


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def next_result(worker: LoopWorker[int], timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = worker.next(0.05)
        if result is not None:
            return result
    raise AssertionError("no result")


def test_loop_worker_delivers_results_in_order() -> None:
    stop = threading.Event()
    counter = iter(range(1, 1000))
    worker: LoopWorker[int] = LoopWorker(lambda: next(counter), stop, Progress())
    worker.start()
    try:
        assert [next_result(worker) for _ in range(3)] == [1, 2, 3]
    finally:
        stop.set()
        worker.join(5)


def test_loop_worker_reraises_the_step_failure() -> None:
    stop = threading.Event()

    def boom() -> int:
        raise ValueError("bad step")

    worker: LoopWorker[int] = LoopWorker(boom, stop, Progress())
    worker.start()
    with pytest.raises(ValueError, match="bad step"):
        next_result(worker)
    worker.join(5)


def test_loop_worker_stall_is_raised() -> None:
    stop, release = threading.Event(), threading.Event()
    clock = ManualClock()
    entered = threading.Event()

    def hang() -> int | None:
        entered.set()
        release.wait(10)
        return None

    worker: LoopWorker[int] = LoopWorker(hang, stop, Progress(clock), limit=60.0)
    worker.start()
    try:
        assert entered.wait(10)
        assert worker.next(0.0) is None
        clock.now += 61.0
        with pytest.raises(WorkerStalled):
            worker.next(0.0)
    finally:
        stop.set()
        release.set()
        worker.join(5)


def test_run_in_thread_returns_and_heartbeats() -> None:
    beats: list[int] = []
    release = threading.Event()

    def work() -> str:
        release.wait(10)
        return "done"

    def beat() -> None:
        beats.append(1)
        if len(beats) >= 2:
            release.set()

    assert run_in_thread(work, beat, threading.Event(), 0.01) == (True, "done")
    assert len(beats) >= 2


def test_run_in_thread_stops_and_raises() -> None:
    stop = threading.Event()
    release = threading.Event()
    stop.set()
    assert run_in_thread(lambda: release.wait(10), lambda: None, stop, 0.01) == (False, None)
    release.set()

    def fail() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        run_in_thread(fail, lambda: None, threading.Event(), 0.01)
    hold = threading.Event()
    with pytest.raises(WorkerStalled):
        run_in_thread(lambda: hold.wait(10), lambda: None, threading.Event(), 0.01, limit=0.05)
    hold.set()


def later() -> int:
    """A wall clock a minute ahead: every file just written counts as settled."""
    return time.time_ns() + 60 * 10**9


def test_parse_cache_reuses_unchanged_files(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(POD.format(name="a"))
    (tmp_path / "bad.yaml").write_text("kind: Deployment\napiVersion: apps/v1\n")
    cache = ParseCache(wall_ns=later)
    seen = FirstSeen(lambda: 0.0)
    first = read_static_pods(tmp_path, "n", seen, cache=cache)
    assert cache.hits == 0
    second = read_static_pods(tmp_path, "n", seen, cache=cache)
    assert cache.hits == 2 and second == first
    (tmp_path / "a.yaml").write_text(POD.format(name="a2"))
    third = read_static_pods(tmp_path, "n", seen, cache=cache)
    assert cache.hits == 3 and [p.name for p in third.pods] == ["a2-n"]
    (tmp_path / "bad.yaml").unlink()
    fourth = read_static_pods(tmp_path, "n", seen, cache=cache)
    assert fourth.errors == () and cache.hits == 4


def test_parse_cache_reuses_built_pods_and_their_wire_form(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(POD.format(name="a"))
    cache = ParseCache(wall_ns=later)
    wall = ManualClock()
    seen = FirstSeen(wall)
    first = read_static_pods(tmp_path, "n", seen, cache=cache)
    second = read_static_pods(tmp_path, "n", seen, cache=cache)
    assert second.pods[0] is first.pods[0] and second.wire[0] is first.wire[0]
    assert second.to_value(0.0).pods == [first.pods[0].to_dict()]
    # the first-seen time is not from the file: when it moves, the pod is rebuilt with it
    seen.forget_except([])
    wall.now = 100.0
    third = read_static_pods(tmp_path, "n", seen, cache=cache)
    assert cache.hits == 2
    assert third.pods[0].metadata.annotations["kubernetes.io/config.seen"] != \
        first.pods[0].metadata.annotations["kubernetes.io/config.seen"]
    assert third.to_value(0.0).pods == [third.pods[0].to_dict()]


def test_parse_cache_rereads_files_changed_within_the_last_seconds(tmp_path: Path) -> None:
    """Two same-size writes within one timestamp tick leave the stat equal: a file changed
    less than ``recent_ns`` ago is read again even though its stat matches."""
    file = tmp_path / "a.yaml"
    file.write_text(POD.format(name="a"))
    changed = max(file.stat().st_mtime_ns, file.stat().st_ctime_ns)
    now = changed + 10**9
    cache = ParseCache(wall_ns=lambda: now, recent_ns=2 * 10**9)
    seen = FirstSeen(lambda: 0.0)
    first = read_static_pods(tmp_path, "n", seen, cache=cache)
    second = read_static_pods(tmp_path, "n", seen, cache=cache)
    assert cache.hits == 0  # read again...
    assert cache.rereads == 1 and second.pods[0] is first.pods[0]  # ...same bytes: not parsed
    now = changed + 3 * 10**9
    read_static_pods(tmp_path, "n", seen, cache=cache)
    assert cache.hits == 1
    # a same-size rewrite within the window is read and parsed again
    file.write_text(POD.format(name="b"))
    now = max(file.stat().st_mtime_ns, file.stat().st_ctime_ns) + 10**9
    third = read_static_pods(tmp_path, "n", seen, cache=cache)
    assert [p.name for p in third.pods] == ["b-n"] and cache.rereads == 1
