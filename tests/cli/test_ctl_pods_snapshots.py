"""`podvisorctl pods` without the HTTP server: the PodList from the typed `desired` and
`statuses` maps, asked from their owners' snapshot sockets (supervisor/ctl_pods.py)."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

from podvisor.cli.ctl_pods import _from_snapshots, format_table
from podvisor.ipc.maps import (
    DESIRED,
    RUNTIME_KEY,
    STATUSES,
    DesiredPod,
    PodRef,
    RuntimeNetwork,
)
from tests.conftest import MapBus
from tests.support.mapvalues import status_value


def test_pods_from_the_map_owners_read_typed_values() -> None:
    with tempfile.TemporaryDirectory(prefix="pv-ctl-", dir="/tmp") as tmp:
        bus = MapBus(Path(tmp), (DESIRED, STATUSES))
        done = threading.Event()

        def serve() -> None:  # the owners' loops
            while not done.is_set():
                bus.serve()
                done.wait(0.01)

        thread = threading.Thread(target=serve)
        try:
            pod = {"apiVersion": "v1", "kind": "Pod", "podvisor": {"source": "file"},
                   "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
                   "spec": {"containers": [{"name": "app", "image": "host"}]}}
            bus.maps[DESIRED.name].set("u1", DesiredPod(pod=pod, source="file"))
            bus.maps[DESIRED.name].set("u2", DesiredPod(pod={**pod, "metadata": {
                "name": "new", "namespace": "default", "uid": "u2"}}, source="file"))
            bus.maps[DESIRED.name].set(RUNTIME_KEY, RuntimeNetwork(True))
            bus.maps[STATUSES.name].set("u1", status_value(
                {"phase": "Running", "containerStatuses": [
                    {"name": "app", "ready": True, "restartCount": 1,
                     "state": {"running": {}}}]}, 2, PodRef("web", "default", "u1")))
            thread.start()
            podlist = _from_snapshots(bus.paths, 2.0)
        finally:
            done.set()
            if thread.is_alive():
                thread.join()
            bus.close()
    assert podlist is not None
    items = {p["metadata"]["name"]: p for p in podlist["items"]}
    assert set(items) == {"web", "new"} and "podvisor" not in items["web"]
    assert items["web"]["status"]["phase"] == "Running"
    assert items["new"]["status"] == {"phase": "Pending"}  # no status yet
    table = format_table(podlist, now=0.0)
    assert "1/1" in table and "Running" in table and "Pending" in table
