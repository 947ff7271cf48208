"""The server's replicas on its service loop (``common.web.WebService``) over a real bus: views
follow the maps, a map is copied into a new view only when it moved, the desired owner's
traffic marks when the sync loop was heard, updates wait for a request or the batch window (on
the injected clock), and the process's loop heartbeats, serves and stops (or dies with its web
thread)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from podvisor.common import FakeClock
from podvisor.common.child import FakeChildContext
from podvisor.common.config import Config
from podvisor.common.web import WebDied, WebService
from podvisor.ipc.clock import SYSTEM_CLOCK, Clock
from podvisor.ipc.maps import DesiredPod, PlegHealth, PlegPod, RuntimeNetwork
from podvisor.ipc.paths import RunPaths
from podvisor.services.server.ports import Ports
from podvisor.services.server.replicas import BATCH, ServerReplicas, View
from tests.conftest import MapBus
from tests.support.mapvalues import status_value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Owners = MapBus


@pytest.fixture
def owners() -> Iterator[Owners]:
    root = Path(tempfile.mkdtemp(prefix="pvsr", dir="/tmp"))
    o = Owners(root, ("desired", "statuses", "pleg"), heartbeat_interval=0.05)
    yield o
    o.close()
    shutil.rmtree(root, ignore_errors=True)


class Server:
    """The server's loop and replicas, turned by hand (no web thread)."""

    def __init__(self, owners: Owners, clock: Clock = SYSTEM_CLOCK) -> None:
        self.owners = owners
        ctx = FakeChildContext(owners.paths, "server", zctx=owners.zctx, clock=clock)
        self.web = WebService(ctx, View(), batch=BATCH)
        self.replicas = ServerReplicas(self.web.loop, self.web.publish)
        self.web._drain = self.replicas.drain  # what run() hands over

    def turn(self) -> None:
        self.owners.serve()
        self.web.loop.turn(self.web.step)

    def synced(self) -> View | None:
        v = self.web.view
        ok = v.desired_synced and v.statuses_synced and v.pleg_synced and v.desired_heard
        return v if ok else None


def test_views_copy_only_the_maps_that_moved(owners: Owners,
                                             wait_for: Callable[..., Any]) -> None:
    owners.maps["desired"].set("u1", DesiredPod(pod={"metadata": {"uid": "u1"}}))
    owners.maps["statuses"].set("u1", status_value({"phase": "Pending"}))
    owners.maps["pleg"].set("_health", PlegHealth(ts=1.0))
    server = Server(owners)
    web = server.web
    try:
        view = wait_for(server.synced, pump=server.turn, message="synced view")
        assert dict(view.desired) == {"u1": DesiredPod(pod={"metadata": {"uid": "u1"}})}
        owners.maps["statuses"].set("u1", status_value({"phase": "Running"}))
        new = wait_for(lambda: web.view if web.view.statuses.get("u1")
                       == status_value({"phase": "Running"}) else None,
                       pump=server.turn, message="status update")
        assert new.desired is view.desired and new.pleg is view.pleg  # not copied again
        heard = new.desired_heard
        assert heard is not None
        # the desired owner's idle heartbeats keep the sync loop "heard" without a new copy
        later = wait_for(lambda: web.view if (web.view.desired_heard or 0) > heard else None,
                         pump=server.turn, message="desired owner heard again")
        assert later.desired is view.desired
    finally:
        web.close()


def test_updates_wait_for_a_request_or_the_batch_on_the_injected_clock(
        owners: Owners, wait_for: Callable[..., Any]) -> None:
    """Lazy: traffic is held (queued in zmq) until a handler asks for a fresh view or the batch
    window ends on the loop's clock (a fake one here: the window ends when the test says)."""
    owners.maps["desired"].set("_runtime", RuntimeNetwork(True))
    owners.maps["statuses"].set("_", status_value({}))
    owners.maps["pleg"].set("_", PlegPod())
    clock = FakeClock(100.0)
    server = Server(owners, clock)
    web, loop = server.web, server.web.loop
    aloop = asyncio.new_event_loop()
    try:
        # until the view is whole (the three snapshots and a heartbeat of the desired owner may
        # arrive in different drains), each turn moves the fake clock past the batch window
        wait_for(server.synced, pump=lambda: (server.turn(), clock.advance(BATCH)),
                 message="synced view")
        # a pump and drain at the clock's final time: the window below starts there. A turn
        # pumps only when traffic came, so send some and turn until the view has it; should
        # other traffic (an owner's heartbeat) open a window first, move the clock past it.
        # (The value must differ from the one set above, status_value({}), which reads as
        # phase Pending: an equal one is not published, and the wait below would end at once,
        # in a window that may have closed already.)
        mark = status_value({"phase": "Running"})
        assert owners.maps["statuses"].set("_", mark)  # changed: published

        def drained() -> View | None:
            view = web.view
            return view if view.statuses.get("_") == mark else None

        first = wait_for(drained, pump=lambda: (
            server.turn(), clock.advance(BATCH) if loop.holding and not drained() else None),
            message="a drain at the clock's final time")
        for i in range(50):
            owners.maps["statuses"].set(f"u{i}", status_value({"phase": "Running"}))
        for _ in range(3):  # the fake clock stands still: within the window of the last drain
            server.turn()
            assert loop.holding and len(web.view.statuses) == 1
        # a handler asks: the loop drains at once and answers it
        calls = 0

        def fresh() -> View | None:
            nonlocal calls
            calls += 1
            task = aloop.create_task(web.refresh())
            view: View = wait_for(lambda: task.result() if task.done() else None,
                                  pump=lambda: (server.turn(),
                                                aloop.run_until_complete(asyncio.sleep(0))))
            return view if len(view.statuses) == 51 else None

        view = wait_for(fresh, message="fresh view on request")
        assert web.view is view and view.desired is first.desired  # not copied again
        # the next updates wait for the batch window again ...
        owners.maps["statuses"].set("late", status_value({"phase": "Pending"}))
        for _ in range(3):
            server.turn()
            assert loop.holding and "late" not in web.view.statuses
        # ... which ends on the injected clock
        clock.advance(BATCH)
        wait_for(lambda: "late" in web.view.statuses, pump=server.turn, message="batch drain")
    finally:
        aloop.close()
        web.close()
    assert asyncio.run(web.refresh()) is web.view  # closed: the last view, at once


def _ctx(root: Path, port: int, clock: Clock = SYSTEM_CLOCK) -> FakeChildContext:
    paths = RunPaths(root)
    paths.ensure()
    return FakeChildContext(paths, "server", config=Config(root_dir=str(root), read_only_port=port),
                            clock=clock)


def test_a_stalled_web_loop_silences_the_heartbeat(tmp_path: Path,
                                                   wait_for: Callable[..., Any]) -> None:
    """The heartbeat comes from the service loop, but only while the web thread's event loop
    turns (a handler blocking it for longer than two heartbeat intervals makes the process
    silent, and the supervisor restarts it as hung); on the injected clock."""
    clock = FakeClock(100.0)
    ctx = _ctx(tmp_path, 0, clock)
    web = WebService(ctx, View())
    stalled, release = threading.Event(), threading.Event()

    async def serve(_: WebService[Any]) -> None:
        stalled.set()
        release.wait(60)  # blocks the web thread's event loop until the test releases it

    def turn() -> None:
        web.loop.turn(web.step)

    web.start(serve, lambda now: None)
    try:
        wait_for(stalled.is_set, message="web thread serving")
        turn()
        assert ctx.beats  # within two intervals of the web loop's last turn
        silent = ctx.beats
        clock.advance(3 * ctx.heartbeat_interval)
        turn()
        turn()
        assert ctx.beats == silent
        release.set()  # the event loop turns again: its timer stamps the clock, beats resume
        wait_for(lambda: ctx.beats > silent, pump=turn, message="heartbeat resumed")
    finally:
        release.set()
        web.close()


def test_the_process_dies_with_its_web_thread(tmp_path: Path) -> None:
    """The read-only port cannot be bound: the web thread dies, the loop raises at once (the
    supervisor restarts the process), having heartbeaten meanwhile."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ctx = _ctx(tmp_path, taken.getsockname()[1])
        web = WebService(ctx, View(), batch=BATCH)
        replicas = ServerReplicas(web.loop, web.publish)
        try:
            with pytest.raises(WebDied, match="address already in use"):
                web.run(Ports(ctx), replicas.drain)
        finally:
            web.close()
    assert ctx.beats


def test_serves_heartbeats_and_returns_once_stop_is_set(
        tmp_path: Path, wait_for: Callable[..., Any]) -> None:
    port = free_port()
    ctx = _ctx(tmp_path, port)
    web = WebService(ctx, View(), batch=BATCH)
    replicas = ServerReplicas(web.loop, web.publish)
    url = f"http://127.0.0.1:{port}/healthz"

    def stop_once_serving() -> None:
        def answered() -> bool:
            try:
                return requests.get(url, timeout=5).status_code in (200, 500)
            except requests.ConnectionError:
                return False

        try:
            wait_for(answered, message="read-only port serving")
        finally:
            ctx.stop.set()

    stopper = threading.Thread(target=stop_once_serving)
    stopper.start()
    try:
        web.run(Ports(ctx), replicas.drain)
    finally:
        stopper.join()
        web.close()
    assert ctx.beats
    with pytest.raises(requests.ConnectionError):
        requests.get(url, timeout=5)
