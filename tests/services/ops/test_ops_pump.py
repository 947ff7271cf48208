"""The ops process's MapPump on its service loop (``common.web.WebService``, turned by hand on
a fake clock) over a real bus: ``PodMaps`` follow the maps, ``version`` (and ``changed``) moves
on pods and process state changes, not on ``_`` entries; ``pods_version`` on pods only."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from podvisor.common import FakeClock
from podvisor.common.child import FakeChildContext
from podvisor.common.web import WebService
from podvisor.ipc.maps import PRESSURE_KEY, DesiredPod, NodePressure, PlegHealth
from podvisor.ipc.messages import ProcessStateChanged
from podvisor.services.ops.pump import MapPump, PodMaps
from tests.conftest import MapBus
from tests.support.mapvalues import status_value


@pytest.fixture
def owners() -> Iterator[MapBus]:
    root = Path(tempfile.mkdtemp(prefix="pvop", dir="/tmp"))
    o = MapBus(root, ("desired", "statuses", "pleg"), heartbeat_interval=0.05)
    yield o
    o.close()
    shutil.rmtree(root, ignore_errors=True)


def test_pod_maps_move_on_pods_and_process_states_not_on_health(
        owners: MapBus, wait_for: Callable[..., Any]) -> None:
    owners.maps["desired"].set("u1", DesiredPod(pod={"metadata": {"uid": "u1"}}))
    ctx = FakeChildContext(owners.paths, "ops", zctx=owners.zctx, clock=FakeClock(100.0))
    web = WebService(ctx, PodMaps(), name="ops")
    notified: list[int] = []

    def on_publish(maps: PodMaps, changed: bool) -> None:  # web.publish, noting the changes
        web.publish(maps, changed)
        if changed:
            notified.append(maps.version)

    pump = MapPump(web.loop, on_publish)
    web._drain = pump.drain  # what run() hands over

    def turn() -> None:
        owners.serve()
        web.loop.turn(web.step)

    try:
        synced = wait_for(lambda: web.view if web.view.synced else None, pump=turn,
                          message="synced maps")
        assert dict(synced.desired) == {"u1": DesiredPod(pod={"metadata": {"uid": "u1"}})}
        assert notified[-1] == synced.version
        # PLEG's _health moves at every relist: a new PodMaps, the same version, nobody woken
        owners.maps["pleg"].set("_health", PlegHealth(ts=2.0))
        health = wait_for(lambda: web.view if "_health" in web.view.pleg else None, pump=turn,
                          message="_health in")
        assert health.version == synced.version and notified[-1] == synced.version
        # a pod's status moves: version + 1, waiters notified
        owners.maps["statuses"].set("u1", status_value({"phase": "Running"}))
        moved = wait_for(lambda: web.view if "u1" in web.view.statuses else None, pump=turn,
                         message="status in")
        assert moved.version == synced.version + 1 and notified[-1] == moved.version
        assert moved.pods_version == synced.pods_version + 1
        assert moved.procs_version == synced.procs_version
        # a subsystem changes state: version + 1 (supervisor.process.state on the bus)
        wait_for(lambda: owners.pub.publish(ProcessStateChanged(
            name="pleg", from_state="RUNNING", to_state="BACKOFF", pid=1, restarts=0))
            and web.view.version > moved.version, pump=turn, message="state change seen")
        assert notified[-1] == web.view.version
        assert web.view.pods_version == moved.pods_version  # no pod moved
        assert web.view.procs_version == moved.procs_version + 1
    finally:
        web.close()


def test_next_change_wakes_the_web_thread_on_a_changed_publish(owners: MapBus) -> None:
    """``WebService.next_change``: at once when ``changes`` moved already, the timeout when
    nothing changed (a publish not marked changed is none), woken by a changed publish made on
    another thread (the loop's), nothing left registered after."""
    ctx = FakeChildContext(owners.paths, "ops", zctx=owners.zctx, clock=FakeClock(100.0))
    web = WebService(ctx, PodMaps(), name="ops")

    async def scenario() -> None:
        assert await web.next_change(-1, 30.0) == 0  # differs already
        await asyncio.to_thread(web.publish, PodMaps(version=0), False)
        assert await web.next_change(0, 0.0) == 0  # not a change: the timeout
        waiter = asyncio.create_task(web.next_change(0, 3600.0))  # only a wake ends it
        await asyncio.to_thread(web.publish, PodMaps(version=1), True)
        assert await waiter == 1 == web.changes
        assert not web._watchers

    try:
        asyncio.run(scenario())
    finally:
        web.close()


def test_pod_maps_carry_the_eviction_managers_pressure(wait_for: Callable[..., Any]) -> None:
    """The dashboard's pressure conditions are the eviction manager's (its ``pressure`` map),
    and the maps are synced without it (eviction may be turned off: the other test)."""
    root = Path(tempfile.mkdtemp(prefix="pvop", dir="/tmp"))
    owners = MapBus(root, ("desired", "statuses", "pleg", "pressure"), heartbeat_interval=0.05)
    ctx = FakeChildContext(owners.paths, "ops", zctx=owners.zctx, clock=FakeClock(100.0))
    web = WebService(ctx, PodMaps(), name="ops")
    pump = MapPump(web.loop, web.publish)
    web._drain = pump.drain

    def turn() -> None:
        owners.serve()
        web.loop.turn(web.step)

    try:
        wait_for(lambda: web.view.synced, pump=turn, message="synced maps")
        assert web.view.pressure is None
        owners.maps["pressure"].set(PRESSURE_KEY, NodePressure(("DiskPressure",), 5.0))
        seen = wait_for(lambda: web.view.pressure, pump=turn, message="pressure in the maps")
        assert seen.conditions == ("DiskPressure",)
    finally:
        web.close()
        owners.close()
        shutil.rmtree(root, ignore_errors=True)
