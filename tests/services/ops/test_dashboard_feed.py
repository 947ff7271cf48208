"""The dashboard's broadcaster (``Dashboard.broadcast``) over the real ``OpsRpc`` and
``PodMaps``, with a fake control link (the supervisor's ``status`` rows), a fake change source
(what ``WebService.next_change`` is) and a fake clock: with nothing moving it pings and never
asks the supervisor but at a recheck; a change computes once and sends one frame, the same
bytes to every client; a computation that finds nothing new sends nothing."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from podvisor.common import FakeClock
from podvisor.ipc.control import ControlClient
from podvisor.ipc.maps import DesiredPod
from podvisor.services.ops.dashboard import Dashboard
from podvisor.services.ops.feed import FeedTimes
from podvisor.services.ops.pump import PodMaps
from podvisor.services.ops.rpc import OpsRpc, RpcDeps
from tests.support.mapvalues import pod_wire, status_value
from tests.support.plegs import pleg_pod

TIMES = FeedTimes(min_gap=0.1, keepalive=15.0, recheck=60.0)
POD = {"metadata": {"name": "web", "namespace": "default", "uid": "u1"},
       "spec": {"containers": [{"name": "app", "image": "host"}]}}


class FakeControl(ControlClient):
    """The supervisor's control endpoint: ``status`` rows of one subsystem (``pid`` and
    ``restarts`` settable, its uptime moving with the clock); counts the calls."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.pid, self.restarts, self.calls = clock, 40, 0, 0

    def call(self, command: str, timeout: float | None = None, **args: Any) -> Any:
        assert command == "status"
        self.calls += 1
        return {"processes": [{"name": "pleg", "state": "RUNNING", "pid": self.pid,
                               "restarts": self.restarts, "uptime": self.clock.now - 990.0,
                               "module": "podvisor.services.pleg.main", "reason": "",
                               "lastExit": None}]}


class FakeChanges:
    """``WebService``'s side of the feed: ``changes`` counts the changed publishes;
    ``next_change`` parks until the test ``poke``s it (the fake clock does not move by
    itself), and ``waiting`` tells the test the broadcaster is asleep."""

    def __init__(self) -> None:
        self.changes = 0
        self.pods_version, self.procs_version = 1, 0  # what the maps say
        self.timeouts: list[float] = []
        self.waiting = asyncio.Event()
        self._wake = asyncio.Event()

    async def next_change(self, since: int, timeout: float) -> int:
        self.timeouts.append(timeout)
        self.waiting.set()
        await self._wake.wait()
        self._wake.clear()
        return self.changes

    def poke(self) -> None:
        self.waiting.clear()  # set again once the broadcaster is back asleep
        self._wake.set()


def _maps(source: FakeChanges, app: str = "app") -> PodMaps:
    pod = {**POD, "spec": {"containers": [{"name": app, "image": "host"}]}}
    return PodMaps(
        desired={"u1": DesiredPod(pod=pod_wire(pod))},
        statuses={"u1": status_value({"phase": "Running", "containerStatuses": [
            {"name": "app", "containerID": "embedded://c1", "state": {"running": {}}}]})},
        pleg={"u1": pleg_pod(containers=[{"id": "c1", "name": "app",
                                          "state": "CONTAINER_RUNNING", "created_at": 1,
                                          "started_at": 2}])},
        synced=True, version=source.changes, pods_version=source.pods_version,
        procs_version=source.procs_version)


def _dashboard(tmp_path: Path, clock: FakeClock, control: FakeControl, source: FakeChanges,
               executor: ThreadPoolExecutor) -> Dashboard:
    rpc = OpsRpc(RpcDeps(control=control, maps=lambda: _maps(source),
                         changed=threading.Condition(), cri=lambda: None,  # type: ignore[arg-type,return-value]
                         logs_dir=tmp_path, runtime_dir=None, identification="podvisor@test",
                         clock=clock))
    return Dashboard(rpc, lambda: _maps(source), executor, source, clock, TIMES)


def _event(data: bytes) -> tuple[str, Any]:
    head, body, end = data.split(b"\n", 2)
    assert end == b"\n"
    return head.removeprefix(b"event: ").decode(), json.loads(body.removeprefix(b"data: "))


def test_idle_pings_a_change_sends_once_the_same_bytes_to_all(tmp_path: Path) -> None:
    clock = FakeClock(1000.0, 1_700_000_000.0)
    control = FakeControl(clock)
    executor = ThreadPoolExecutor(1)

    async def scenario() -> None:
        source = FakeChanges()
        dash = _dashboard(tmp_path, clock, control, source, executor)
        a: asyncio.Queue[bytes] = asyncio.Queue()
        b: asyncio.Queue[bytes] = asyncio.Queue()
        dash.clients |= {a, b}
        task = asyncio.create_task(dash.broadcast())

        first = await a.get()  # a first client gets a state at once
        assert await b.get() is first
        kind, state = _event(first)
        assert kind == "state" and state["now"] == 1_700_000_000
        assert [p["namespec"] for p in state["processes"]] == ["agent:pleg", "default.web:app"]
        await source.waiting.wait()
        assert control.calls == 1 and source.timeouts[-1] == TIMES.keepalive

        # 16 s of nothing: a ping with the server's clock, the supervisor not asked
        clock.advance(16.0)
        source.poke()
        ping = await a.get()
        assert await b.get() is ping
        assert _event(ping) == ("ping", {"now": 1_700_000_016, "every": TIMES.keepalive})
        await source.waiting.wait()
        assert control.calls == 1

        # the recheck (60 s after the state): the supervisor is asked, nothing new is sent
        # (the uptime moved, the page ticks it itself); then the ping that was due
        clock.advance(60.0)
        source.poke()
        assert _event(await a.get())[0] == "ping"
        assert _event(await b.get())[0] == "ping"
        assert control.calls == 2 and dash.sends == 1

        # pleg restarted (a process state message moved the maps' version): one state
        clock.advance(1.0)
        control.pid, control.restarts = 41, 1
        source.changes += 1
        source.procs_version += 1
        source.poke()
        moved = await a.get()
        assert await b.get() is moved and dash.sends == 2
        kind, state = _event(moved)
        assert kind == "state" and state["processes"][0]["pid"] == 41
        assert any(c["name"] == "agent:pleg" and c["restart"] for c in state["timeline"])
        await source.waiting.wait()
        assert control.calls == 3

        # a change that changes nothing on the page: computed, not sent
        clock.advance(1.0)
        source.changes += 1
        source.poke()
        await source.waiting.wait()  # back asleep after the computation
        assert control.calls == 4 and dash.sends == 2 and a.empty() and b.empty()
        assert dash.last_frame is moved

        dash.clients.clear()  # the last page closed: the broadcaster ends
        source.poke()
        await task

        # a page opened later with nothing moved: the last state and the clock, no computation
        c = dash.subscribe()
        assert await c.get() == b"retry: 1000\n\n"
        assert await c.get() is moved and _event(await c.get())[0] == "ping"
        await source.waiting.wait()
        assert control.calls == 4 and c.empty()
        # something moved while nobody listened: not the old state, a new one computed at once
        dash.clients.clear()
        source.poke()
        assert dash._task is not None
        await dash._task
        clock.advance(1.0)
        source.changes += 1
        control.pid = 42
        d = dash.subscribe()
        assert await d.get() == b"retry: 1000\n\n"
        kind, state = _event(await d.get())
        assert kind == "state" and state["processes"][0]["pid"] == 42 and control.calls == 5
        dash.clients.clear()
        source.poke()
        assert dash._task is not None
        await dash._task

    try:
        asyncio.run(scenario())
    finally:
        executor.shutdown()


def test_a_subsystem_change_inside_the_gap_is_sent_at_once(tmp_path: Path) -> None:
    """A pod moved (the full state computed), then a subsystem is killed inside the gap: its
    new row is sent at once with the pods as computed, and the full state follows once the gap
    has passed (only when the pods moved again meanwhile: here they did)."""
    clock = FakeClock(1000.0, 1_700_000_000.0)
    control = FakeControl(clock)
    executor = ThreadPoolExecutor(1)

    async def scenario() -> None:
        source = FakeChanges()
        maps = {"app": "app"}
        dash = _dashboard(tmp_path, clock, control, source, executor)
        dash.maps = lambda: _maps(source, maps["app"])
        a: asyncio.Queue[bytes] = asyncio.Queue()
        dash.clients.add(a)
        task = asyncio.create_task(dash.broadcast())
        _event(await a.get())
        await source.waiting.wait()

        # inside the gap after that computation: a pod moved (the container renamed); the
        # broadcaster waits for the gap's end or another change
        maps["app"] = "app2"
        source.pods_version += 1
        source.changes += 1
        source.poke()
        await source.waiting.wait()
        assert source.timeouts[-1] == pytest.approx(TIMES.min_gap) and a.empty()
        # then pleg changes state, still inside the gap (the fake clock stands still): sent at
        # once (AGENTS)
        control.pid = 41
        source.changes += 1
        source.procs_version += 1
        source.poke()
        kind, state = _event(await a.get())
        assert kind == "state" and state["processes"][0]["pid"] == 41
        assert state["processes"][1]["namespec"] == "default.web:app"  # the pods as computed
        # the gap passes (the broadcaster waits for its end or a change): the full state, with
        # the pod as it is now
        await source.waiting.wait()
        assert source.timeouts[-1] == pytest.approx(TIMES.min_gap)
        clock.advance(TIMES.min_gap)
        source.poke()
        kind, state = _event(await a.get())
        assert state["processes"][1]["namespec"] == "default.web:app2"
        assert control.calls == 3 and dash.sends == 3

        dash.clients.clear()
        source.poke()
        await task

    try:
        asyncio.run(scenario())
    finally:
        executor.shutdown()
