"""The server's ReplicaPump over a real bus: views follow the maps, a map is copied into a new
view only when it moved, and the desired owner's traffic marks when the sync loop was heard."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from podvisor.ipc.bus import BusProxy, Publisher
from podvisor.ipc.clone import MapOwner
from podvisor.ipc.paths import RunPaths
from podvisor.services.server.replicas import ReplicaPump


class Owners:
    def __init__(self, root: Path) -> None:
        self.paths = RunPaths(root)
        self.paths.ensure()
        self.zctx: zmq.Context[Any] = zmq.Context()
        self.proxy = BusProxy(self.zctx, self.paths)
        self.proxy.start()
        self.pub = Publisher(self.zctx, self.paths, "test")
        self.maps = {name: MapOwner(self.zctx, self.paths, self.pub, name, heartbeat_interval=0.05)
                     for name in ("desired", "statuses", "pleg")}

    def serve(self) -> None:
        """Answer snapshots and send idle heartbeats (what the owners' loops do)."""
        for owner in self.maps.values():
            owner.serve()
            owner.tick(time.monotonic())

    def close(self) -> None:
        for owner in self.maps.values():
            owner.close()
        self.pub.close()
        self.proxy.stop()
        self.zctx.destroy(linger=0)


@pytest.fixture
def owners() -> Iterator[Owners]:
    root = Path(tempfile.mkdtemp(prefix="pvsr", dir="/tmp"))
    o = Owners(root)
    yield o
    o.close()
    shutil.rmtree(root, ignore_errors=True)


def test_views_copy_only_the_maps_that_moved(owners: Owners,
                                             wait_for: Callable[..., Any]) -> None:
    owners.maps["desired"].set("u1", {"pod": 1})
    owners.maps["statuses"].set("u1", {"phase": "Pending"})
    owners.maps["pleg"].set("_health", {"ts": 1.0})
    pump = ReplicaPump(owners.zctx, owners.paths)
    pump.start()
    try:
        view = wait_for(lambda: pump.view if pump.view.desired_synced and
                        pump.view.statuses_synced and pump.view.pleg_synced and
                        pump.view.desired_heard is not None else None,
                        pump=owners.serve, message="synced view")
        assert dict(view.desired) == {"u1": {"pod": 1}}
        owners.maps["statuses"].set("u1", {"phase": "Running"})
        new = wait_for(lambda: pump.view if pump.view.statuses.get("u1") == {"phase": "Running"}
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
