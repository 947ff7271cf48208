"""Embedded runtime only: state survives kill -9 of the runtime; exit codes of containers that
die while no runtime runs are recorded; GetContainerEvents pushes deaths at once."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from cri_api.v1 import api_pb2 as pb

from tests.conftest import process_gone

SLEEP = ["sleep", "1000"]


def _embedded(cri_runtime: Any) -> Any:
    import pytest

    if cri_runtime.name != "embedded":
        pytest.skip("durability of the embedded runtime's own state")
    return cri_runtime.embedded


def _pid(rt: Any, cid: str) -> int:
    started = json.loads((rt.embedded.root / "containers" / f"{cid}.started.json").read_text())
    return int(started["pid"])


@contextlib.contextmanager
def event_log(client: Any) -> Iterator[list[pb.ContainerEventResponse]]:
    """The runtime's GetContainerEvents, appended to a list by a reader thread while the block
    runs; the block starts once the runtime has subscribed the stream (its headers came), so no
    event of the block falls before the subscription. The stream is closed and the thread gone
    at the end."""
    stream = client.container_events()
    events: list[pb.ContainerEventResponse] = []
    subscribed = threading.Event()

    def read() -> None:
        stream.wait_subscribed()  # the stream's thread: the one that reads it
        subscribed.set()
        events.extend(iter(stream))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert subscribed.wait(15), "the runtime never subscribed the event stream"
        yield events
    finally:
        stream.close()
        reader.join(5)
    assert not reader.is_alive()


def test_kill9_runtime_keeps_containers_and_readopts(cri_runtime: Any) -> None:
    embedded = _embedded(cri_runtime)
    client = cri_runtime.client
    sandbox = cri_runtime.run("durable")
    cids = [cri_runtime.start(sandbox, f"c{i}", SLEEP) for i in range(3)]
    before = {cid: client.container_status(cid) for cid in cids}
    procs = {cid: psutil.Process(_pid(cri_runtime, cid)) for cid in cids}

    embedded.kill9()
    for proc in procs.values():
        assert proc.is_running()  # nothing follows the runtime down
    embedded.start()

    assert {s.id for s in client.list_pod_sandbox()} == {sandbox[0]}
    listed = {c.id: c.state for c in client.list_containers()}
    assert listed == {cid: pb.CONTAINER_RUNNING for cid in cids}
    for cid in cids:
        after = client.container_status(cid)
        assert after.started_at == before[cid].started_at
        assert after.created_at == before[cid].created_at
        assert _pid(cri_runtime, cid) == procs[cid].pid
    # The re-adopted containers are fully controllable.
    client.stop_container(cids[0], 10)
    assert client.container_status(cids[0]).exit_code == 143
    assert not procs[cids[0]].is_running()


def test_exit_while_runtime_down_is_recorded(cri_runtime: Any, poll: Any) -> None:
    embedded = _embedded(cri_runtime)
    client = cri_runtime.client
    go = cri_runtime.tmp / "go"
    cmd = ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done; exit 7"]
    cid = cri_runtime.start(cri_runtime.run("downexit"), "waiter", cmd)
    proc = psutil.Process(_pid(cri_runtime, cid))
    started_at = client.container_status(cid).started_at

    embedded.kill9()
    go.write_text("now")
    poll(lambda: process_gone(proc), message="container to exit while the runtime is down")
    exit_file = embedded.root / "containers" / f"{cid}.exit.json"
    poll(exit_file.exists, message="monitor to record the exit")
    embedded.start()

    status = client.container_status(cid)
    assert status.state == pb.CONTAINER_EXITED
    assert status.exit_code == 7
    assert status.finished_at > started_at


def test_runtime_sigterm_leaves_containers_running(cri_runtime: Any) -> None:
    embedded = _embedded(cri_runtime)
    cid = cri_runtime.start(cri_runtime.run("graceful"), "c", SLEEP)
    proc = psutil.Process(_pid(cri_runtime, cid))
    embedded.stop()
    assert proc.is_running()
    embedded.start()
    assert cri_runtime.client.container_status(cid).state == pb.CONTAINER_RUNNING


def test_container_events_push_lifecycle_and_death(cri_runtime: Any, poll: Any) -> None:
    _embedded(cri_runtime)
    client = cri_runtime.client
    with event_log(client) as events:
        go = cri_runtime.tmp / "die"
        cmd = ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.01; done; exit 3"]
        sandbox = cri_runtime.run("events")
        cid = client.create_container(sandbox[0], cri_runtime.container_config("c", cmd),
                                      sandbox[1])
        poll(lambda: any(e.container_id == cid for e in list(events)), message="created event")
        client.start_container(cid)
        Path(go).write_text("x")

        def stopped() -> pb.ContainerEventResponse | None:
            return next((e for e in list(events) if e.container_id == cid and
                         e.container_event_type == pb.CONTAINER_STOPPED_EVENT), None)
        event = poll(stopped, message="stopped event")
        assert event.containers_statuses[0].exit_code == 3
        assert event.pod_sandbox_status.id == sandbox[0]
        client.remove_container(cid)
        poll(lambda: any(e.container_id == cid and
                         e.container_event_type == pb.CONTAINER_DELETED_EVENT
                         for e in list(events)), message="deleted event")
        kinds = [e.container_event_type for e in list(events) if e.container_id == cid]
        assert kinds == [pb.CONTAINER_CREATED_EVENT, pb.CONTAINER_STARTED_EVENT,
                         pb.CONTAINER_STOPPED_EVENT, pb.CONTAINER_DELETED_EVENT]


def test_container_events_carry_every_container_of_the_sandbox(cri_runtime: Any,
                                                                poll: Any) -> None:
    """As the CRI asks: an event holds the sandbox's status and the statuses of all its
    containers (the event's own first), so a consumer needs no call to know the pod."""
    _embedded(cri_runtime)
    client = cri_runtime.client
    with event_log(client) as events:
        sandbox = cri_runtime.run("allstatuses")
        first = cri_runtime.start(sandbox, "first", SLEEP)
        second = client.create_container(
            sandbox[0], cri_runtime.container_config("second", ["sh", "-c", "exit 4"]),
            sandbox[1])
        client.start_container(second)

        def stopped() -> pb.ContainerEventResponse | None:
            return next((e for e in list(events) if e.container_id == second and
                         e.container_event_type == pb.CONTAINER_STOPPED_EVENT), None)
        event = poll(stopped, message="stopped event of the second container")
        assert [s.id for s in event.containers_statuses] == [second, first]
        assert event.containers_statuses[0].exit_code == 4
        assert event.containers_statuses[1].state == pb.CONTAINER_RUNNING
        assert event.pod_sandbox_status.state == pb.SANDBOX_READY
        client.remove_container(second)

        def deleted() -> pb.ContainerEventResponse | None:
            return next((e for e in list(events) if e.container_id == second and
                         e.container_event_type == pb.CONTAINER_DELETED_EVENT), None)
        assert [s.id for s in poll(deleted, message="deleted event").containers_statuses] \
            == [first]


def test_monitors_exit_with_their_containers(cri_runtime: Any, poll: Any) -> None:
    _embedded(cri_runtime)
    cid = cri_runtime.start(cri_runtime.run("monexit"), "c", ["true"])
    cri_runtime.wait_exited(cid)
    started = json.loads((cri_runtime.embedded.root / "containers" / f"{cid}.started.json")
                         .read_text())
    poll(lambda: not _alive(int(started["monitor_pid"])), message="monitor to exit")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_kill9_runtime_then_remove_everything(cri_runtime: Any) -> None:
    embedded = _embedded(cri_runtime)
    sandbox = cri_runtime.run("cleanup")
    cri_runtime.start(sandbox, "c", SLEEP)
    embedded.kill9()
    embedded.start()
    cri_runtime.client.stop_pod_sandbox(sandbox[0])
    cri_runtime.client.remove_pod_sandbox(sandbox[0])
    assert os.listdir(embedded.root / "containers") == []
    assert _journal_live(embedded.root) == set()


def _journal_live(root: Path) -> set[str]:
    """The IDs the runtime's journal (store.py) still holds, read without touching it."""
    live: set[str] = set()
    for line in (root / "meta.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["op"] in ("sandbox", "container"):
            live.add(rec["id"])
        else:
            live.discard(rec["id"])
    return live
