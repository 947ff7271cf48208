"""common.pool.ElasticPool: ThreadPoolExecutor's contract (results, exceptions, the bound,
reuse of an idle thread, shutdown with and without cancelling, in-flight work finished at
interpreter exit) and what it adds: idle threads exit, and no item is ever stranded by a thread
that exits at the moment it is submitted."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, wait
from pathlib import Path
from typing import Any

import pytest

from podvisor.common.pool import ElasticPool


def test_results_exceptions_and_the_bound(wait_for: Callable[..., Any]) -> None:
    pool = ElasticPool(3, "t", idle_timeout=60.0)
    gate = threading.Event()
    try:
        assert pool.submit(lambda x: x * 2, 21).result(10) == 42
        with pytest.raises(ZeroDivisionError):
            pool.submit(lambda: 1 / 0).result(10)
        blocked = [pool.submit(gate.wait, 30) for _ in range(6)]
        wait_for(lambda: pool.threads == 3, message="three threads, no more")
        assert not any(f.done() for f in blocked)
        gate.set()
        assert all(f.result(10) is True for f in blocked)
        assert pool.threads == 3
        names = {t.name for t in threading.enumerate() if t.name.startswith("t_")}
        assert len(names) == 3
    finally:
        gate.set()
        pool.shutdown()
    assert pool.threads == 0


def test_an_idle_thread_is_reused_before_another_starts() -> None:
    pool = ElasticPool(8, "reuse", idle_timeout=60.0)
    try:
        idents = {pool.submit(threading.get_ident).result(10) for _ in range(20)}
        assert len(idents) == 1 and pool.threads == 1
    finally:
        pool.shutdown()


def test_idle_threads_exit_and_start_again(wait_for: Callable[..., Any]) -> None:
    pool = ElasticPool(4, "idle", idle_timeout=0.05)
    gate = threading.Event()
    try:
        burst = [pool.submit(gate.wait, 30) for _ in range(4)]
        wait_for(lambda: pool.threads == 4, message="the burst's four threads")
        gate.set()
        wait(burst, 10)
        wait_for(lambda: pool.threads == 0, message="idle threads to exit")
        assert not [t for t in threading.enumerate() if t.name.startswith("idle_")]
        assert pool.submit(lambda: "again").result(10) == "again"
    finally:
        gate.set()
        pool.shutdown()


def test_no_item_is_stranded_by_threads_timing_out_as_it_is_submitted() -> None:
    """Threads time out all the time here (0.1 ms): a submit that counted on an idle thread
    finds that thread still taking its item, or a new one started."""
    pool = ElasticPool(3, "race", idle_timeout=0.0001)
    futures: list[Any] = []

    def submitter() -> None:
        for i in range(500):
            futures.append(pool.submit(lambda n: n, i))

    try:
        submitters = [threading.Thread(target=submitter) for _ in range(4)]
        for t in submitters:
            t.start()
        for t in submitters:
            t.join()
        done, not_done = wait(futures, 30)
        assert not not_done and len(done) == 2000
    finally:
        pool.shutdown()


def test_shutdown_cancels_queued_work_and_refuses_more() -> None:
    pool = ElasticPool(1, "stop", idle_timeout=60.0)
    gate, started = threading.Event(), threading.Event()

    def hold() -> bool:
        started.set()
        return gate.wait(30)
    running = pool.submit(hold)
    assert started.wait(10)  # running, not queued: shutdown cancels only what is queued
    queued = [pool.submit(lambda: None) for _ in range(3)]
    pool.shutdown(wait=False, cancel_futures=True)
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
    gate.set()
    assert running.result(10) is True
    for f in queued:
        with pytest.raises(CancelledError):
            f.result(10)
    pool.shutdown(wait=True)
    assert pool.threads == 0


def test_queued_work_runs_after_a_plain_shutdown() -> None:
    pool = ElasticPool(2, "drain", idle_timeout=60.0)
    gate = threading.Event()
    first = [pool.submit(gate.wait, 30) for _ in range(2)]
    later = [pool.submit(lambda n: n, i) for i in range(5)]
    pool.shutdown(wait=False)
    gate.set()
    pool.shutdown(wait=True)
    assert all(f.result(0) for f in first) and [f.result(0) for f in later] == list(range(5))


def test_the_interpreter_exits_at_once_and_finishes_work_in_flight(tmp_path: Path) -> None:
    """As ThreadPoolExecutor: exit waits for a running item (non-daemon threads), not for idle
    threads' timeouts (here an hour)."""
    marker = tmp_path / "done"
    script = textwrap.dedent(f"""
        import threading, time
        from podvisor.common.pool import ElasticPool
        pool = ElasticPool(4, "exit", idle_timeout=3600.0)
        for _ in range(3):
            pool.submit(lambda: None).result()
        started = threading.Event()
        def slow():
            started.set()
            time.sleep(0.3)
            open({str(marker)!r}, "w").write("ok")
        pool.submit(slow)
        started.wait()
    """)
    proc = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    assert marker.read_text() == "ok"



class _TimesOutOnCue(ElasticPool):
    """The thread's first wait (after its first item) ends as a timeout although a submit
    woke it: the item arrived as its idle time ran out."""

    def __init__(self) -> None:
        super().__init__(1, "cue", idle_timeout=60.0)
        self.waits = 0
        self.waiting = threading.Event()

    def _wait_for_work(self) -> bool:
        self.waits += 1
        if self.waits == 1:
            self.waiting.set()
            self._work_ready.wait(30)  # woken by the submit
            return False  # ... and reports a timeout
        return super()._wait_for_work()


def test_a_submit_that_counted_on_a_timing_out_thread_is_run() -> None:
    pool = _TimesOutOnCue()
    try:
        assert pool.submit(lambda: 1).result(10) == 1
        assert pool.waiting.wait(10)
        second = pool.submit(lambda: 2)  # the waiting thread is counted: no new thread
        assert pool.threads == 1
        assert second.result(10) == 2  # the thread "timed out" with an item queued: ran it
        assert pool.threads == 1
    finally:
        pool.shutdown()


def test_a_thread_that_goes_on_to_the_next_item_leaves_no_phantom_idle_thread(
        wait_for: Callable[..., Any]) -> None:
    """Two items queued behind a busy single thread: it runs both back to back, then idles
    out. A later submit must start a thread (the first pool counted the thread idle once per
    item: after it exited, a submit believed an idle thread would take its item, started none,
    and the item was never run)."""
    pool = ElasticPool(1, "phantom", idle_timeout=0.05)
    gate = threading.Event()
    try:
        busy = pool.submit(gate.wait, 30)
        queued = [pool.submit(lambda: "q") for _ in range(2)]
        gate.set()
        assert busy.result(10) is True and [f.result(10) for f in queued] == ["q", "q"]
        wait_for(lambda: pool.threads == 0, message="the thread to idle out")
        assert pool.submit(lambda: "later").result(10) == "later"
    finally:
        gate.set()
        pool.shutdown()
