"""The server's ReplicaPump over a real bus: views follow the maps, a map is copied into a new
view only when it moved, and the desired owner's traffic marks when the sync loop was heard."""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from podvisor.common.child import ChildContext
from podvisor.common.config import Config
from podvisor.common.logs import MemoryLogger
from podvisor.ipc.maps import DesiredPod, PodStatusValue, RuntimeNetwork
from podvisor.ipc.paths import RunPaths
from podvisor.services.server.main import PumpDied, _serve
from podvisor.services.server.replicas import ReplicaPump, View
from tests.conftest import MapBus


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


def test_views_copy_only_the_maps_that_moved(owners: Owners,
                                             wait_for: Callable[..., Any]) -> None:
    owners.maps["desired"].set("u1", DesiredPod(pod={"metadata": {"uid": "u1"}}))
    owners.maps["statuses"].set("u1", PodStatusValue({"phase": "Pending"}))
    owners.maps["pleg"].set("_health", {"ts": 1.0})
    pump = ReplicaPump(owners.zctx, owners.paths)
    pump.start()
    try:
        view = wait_for(lambda: pump.view if pump.view.desired_synced and
                        pump.view.statuses_synced and pump.view.pleg_synced and
                        pump.view.desired_heard is not None else None,
                        pump=owners.serve, message="synced view")
        assert dict(view.desired) == {"u1": DesiredPod(pod={"metadata": {"uid": "u1"}})}
        owners.maps["statuses"].set("u1", PodStatusValue({"phase": "Running"}))
        new = wait_for(lambda: pump.view if pump.view.statuses.get("u1")
                       == PodStatusValue({"phase": "Running"})
                       else None, pump=owners.serve, message="status update")
        assert new.desired is view.desired and new.pleg is view.pleg  # not copied again
        heard = new.desired_heard
        assert heard is not None
        # the desired owner's idle heartbeats keep the sync loop "heard" without a new copy
        later = wait_for(lambda: pump.view if (pump.view.desired_heard or 0) > heard else None,
                         pump=owners.serve, message="desired owner heard again")
        assert later.desired is view.desired
    finally:
        pump.close()
    assert not pump.alive()


class _DeadPump:
    error = RuntimeError("boom")
    view = View()

    def alive(self) -> bool:
        return False

    async def refresh(self) -> View:
        return self.view


def _ctx(root: Path, beats: list[int]) -> ChildContext:
    config = Config(root_dir=str(root), read_only_port=free_port())
    return ChildContext("server", config, RunPaths(root), MemoryLogger(),  # type: ignore[arg-type]
                        zmq.Context.instance(), beat=lambda: beats.append(1))


def test_serve_heartbeats_and_stops_when_the_pump_thread_dies(tmp_path: Path) -> None:
    beats: list[int] = []
    ctx = _ctx(tmp_path, beats)
    with pytest.raises(PumpDied, match="boom"):
        asyncio.run(_serve(ctx, _DeadPump()))  # type: ignore[arg-type]
    assert beats


def test_serve_returns_once_stop_is_set(tmp_path: Path) -> None:
    beats: list[int] = []
    ctx = _ctx(tmp_path, beats)
    pump = ReplicaPump(ctx.zctx, ctx.paths)
    pump.start()
    try:
        ctx.stop.set()
        asyncio.run(_serve(ctx, pump))
    finally:
        pump.close()
    assert beats


def test_updates_wait_for_a_request_or_the_batch_not_one_drain_each(
        owners: Owners, wait_for: Callable[..., Any]) -> None:
    """Lazy: traffic is held (queued in zmq) until a handler asks for a fresh view or the batch
    window ends; a burst of updates is drained per request, not once per update."""
    owners.maps["desired"].set("_runtime", RuntimeNetwork(True))
    owners.maps["statuses"].set("_", PodStatusValue({}))
    owners.maps["pleg"].set("_", {"n": 0})
    pump = ReplicaPump(owners.zctx, owners.paths, batch=3600.0)
    pump.start()
    calls = 0

    def refreshed() -> Any:
        nonlocal calls
        calls += 1
        return asyncio.run(pump.refresh())

    try:
        wait_for(lambda: pump.view.desired_synced and pump.view.statuses_synced
                 and pump.view.pleg_synced, pump=owners.serve, message="synced view")
        first = refreshed()
        before = pump.pumps
        for i in range(50):
            owners.maps["statuses"].set(f"u{i}", PodStatusValue({"phase": "Running"}))
        def all_in() -> View | None:
            view = refreshed()
            return view if len(view.statuses) == 51 else None

        view = wait_for(all_in, pump=owners.serve, message="fresh view on request")
        assert pump.pumps - before <= calls  # drained per request only
        assert view.desired is first.desired  # not copied again
        assert pump.view is view
    finally:
        pump.close()
    assert asyncio.run(pump.refresh()) is pump.view  # a dead pump: the last view, at once
