"""NodeShutdownService over a real bus (the proxy, and the ``desired`` / ``statuses`` owners in
the test playing the sync loop and status): a ``NodeShutdown`` makes ``node-shutdown`` active,
the groups' ``FailPod`` go out in priority order (the next only once ``desired`` says the first
terminated), and ``NodeShutdownDone`` comes once the statuses say Failed. No logind here (the
logind path: test_e2e_logind.py)."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from podvisor.common.child import FakeChildContext
from podvisor.common.config import Config
from podvisor.ipc.bus import Subscriber
from podvisor.ipc.maps import NODE_SHUTDOWN_KEY, DesiredPod, NodeShutdownState
from podvisor.ipc.messages import FailPod, NodeShutdown, NodeShutdownDone
from podvisor.services.nodeshutdown.main import NodeShutdownService
from podvisor.services.pod import pod_from_dict
from tests.conftest import MapBus
from tests.support.mapvalues import status_value


def entry(uid: str, priority: int) -> DesiredPod:
    pod = pod_from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": uid, "namespace": "default", "uid": uid}, "spec": {
        "priority": priority, "containers": [{"name": "c", "image": "host"}]}}).pod
    return DesiredPod(pod=pod.to_dict(), worker="syncing")


class Bus(MapBus):
    def __init__(self, root: Path) -> None:
        super().__init__(root, ("desired", "statuses"))
        self.desired, self.statuses = self.maps["desired"], self.maps["statuses"]
        config = Config(root_dir=str(root), shutdown_grace_period=20.0,
                        shutdown_grace_period_critical_pods=10.0)
        self.ctx = FakeChildContext(self.paths, "nodeshutdown", zctx=self.zctx, config=config)
        self.sub = Subscriber(self.zctx, self.paths, [FailPod.TOPIC, NodeShutdownDone.TOPIC])
        self.seen: list[Any] = []

    def turn(self, svc: NodeShutdownService) -> None:
        self.serve()
        svc.loop.turn(lambda now: min(svc.step(now) or now + 0.05, now + 0.05))
        while (env := self.sub.recv(0)) is not None:
            self.seen.append(env.message)


@pytest.fixture
def bus() -> Iterator[Bus]:
    root = Path(tempfile.mkdtemp(prefix="pvns", dir="/tmp"))
    b = Bus(root)
    yield b
    b.sub.close()
    b.close()
    shutil.rmtree(root, ignore_errors=True)


def run_until(bus: Bus, svc: NodeShutdownService, cond: Callable[[], Any],
              timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, "condition not met in time"
        bus.turn(svc)
    return value


def fails(bus: Bus) -> list[str]:
    return [m.uid for m in bus.seen if isinstance(m, FailPod)]


def test_a_request_drains_by_priority_and_answers_done(bus: Bus) -> None:
    pods = {"app": entry("app", 0), "crit": entry("crit", 2_000_000_000)}
    for uid, value in pods.items():
        bus.desired.set(uid, value)
    svc = NodeShutdownService(bus.ctx, None)
    try:
        run_until(bus, svc, lambda: svc.desired.synced and svc.state.get(NODE_SHUTDOWN_KEY))
        assert svc.state.get(NODE_SHUTDOWN_KEY) == NodeShutdownState()
        # the bus may drop the first requests (a slow joiner): the supervisor sends again
        def asked() -> bool:
            if svc.drain is None:
                bus.pub.publish(NodeShutdown())
            return svc.drain is not None

        run_until(bus, svc, asked)
        state = svc.state.get(NODE_SHUTDOWN_KEY)
        assert state is not None and state.active and state.trigger == "request"
        run_until(bus, svc, lambda: "app" in fails(bus))
        request = next(m for m in bus.seen if isinstance(m, FailPod))
        assert (request.reason, request.grace, request.event_type) == ("Terminated", 10, "Normal")
        assert "crit" not in fails(bus)  # its group waits for the first
        bus.desired.set("app", replace(pods["app"], failed=True, reason="Terminated",
                                       worker="terminated"))
        run_until(bus, svc, lambda: "crit" in fails(bus))
        bus.desired.set("crit", replace(pods["crit"], failed=True, reason="Terminated",
                                        worker="terminated"))
        assert not any(isinstance(m, NodeShutdownDone) for m in bus.seen)
        for uid in pods:
            bus.statuses.set(uid, status_value({"phase": "Failed", "reason": "Terminated"}))
        done = run_until(bus, svc, lambda: next(
            (m for m in bus.seen if isinstance(m, NodeShutdownDone)), None))
        assert (done.pods, done.trigger) == (2, "request")
        assert [e["event"] for e in bus.ctx.log.events if e["event"].startswith(
            "nodeshutdown.")][:1] == ["nodeshutdown.begin"]
    finally:
        svc.loop.close()
