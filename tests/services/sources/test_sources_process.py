"""Integration: ``source-file`` as a real supervised process publishing on the real bus."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.clone import MapReplica
from podvisor.ipc.maps import POD_SET_KEY, PodSetValue, pods_map

POD = ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n"
       "  - name: c\n    image: host\n")


@pytest.fixture
def zctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


class SetReader:
    """A replica of a source's ``pods-<source>`` map (the one path for pod sets), keeping
    every value it was set to, in order."""

    def __init__(self, zctx: zmq.Context[zmq.Socket[bytes]], paths: Any, source: str) -> None:
        self.values: list[PodSetValue] = []
        self.replica = MapReplica(zctx, paths, pods_map(source), self._changed,
                                  snapshot_timeout=0.5, clock=SYSTEM_CLOCK)

    def _changed(self, key: str, old: Any, new: Any) -> None:
        if key == POD_SET_KEY and isinstance(new, PodSetValue):
            self.values.append(new)

    def close(self) -> None:
        self.replica.close()


def next_set(sub: SetReader, match: Callable[[PodSetValue], bool], timeout: float = 20.0,
             epoch_not: str | None = None) -> PodSetValue:
    """The next value set that matches (``epoch_not``: from a new owner incarnation)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sub.replica.pump(0.5)
        if epoch_not is not None:
            value = sub.replica.get(POD_SET_KEY)
            if sub.replica.epoch not in (None, epoch_not) and value is not None and match(value):
                return value  # type: ignore[no-any-return]
            continue
        while sub.values:
            value = sub.values.pop(0)
            if match(value):
                return value
    seen = [names(v) for v in sub.values[-3:]]
    raise AssertionError(f"no matching pod set in {timeout}s; saw {seen}")


def names(msg: PodSetValue) -> list[str]:
    return [p["metadata"]["name"] for p in msg.pods]


def test_source_file_process_publishes_full_sets(agent: Any, tmp_path: Path,
                                                 zctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "a.yaml").write_text(POD.format(name="a"))
    (manifests / "bad.yaml").write_text("apiVersion: apps/v1\nkind: Deployment\n")
    config = {
        "nodeName": "test-node",
        "staticPodPath": str(manifests),
        "fileCheckFrequency": "20s",  # changes below must come from inotify, not relists
        "supervision": {
            "builtins": False, "heartbeatInterval": "200ms", "shutdownTimeout": "15s",
            "logLevel": "debug",
            "processes": {"source-file": {"module": "podvisor.services.sources.file_main",
                                          "heartbeatTimeout": "3s", "stopTimeout": "2s"}},
        },
    }
    handle = agent(config=config)
    sub = SetReader(zctx, handle.paths, "file")
    try:
        pid = handle.wait_state("source-file", "RUNNING")["pid"]
        first = next_set(sub, lambda m: names(m) == ["a-test-node"])
        assert first.source == "file"
        assert [(e["file"], e["field"]) for e in first.errors] == [
            (str(manifests / "bad.yaml"), "kind")]

        (manifests / "b.yaml").write_text(POD.format(name="b"))
        next_set(sub, lambda m: names(m) == ["a-test-node", "b-test-node"])
        (manifests / "a.yaml").unlink()
        next_set(sub, lambda m: names(m) == ["b-test-node"])

        # Stateless: a killed source comes back and publishes its full set again.
        epoch = sub.replica.epoch
        os.kill(pid, signal.SIGKILL)
        handle.wait_state("source-file", "RUNNING", where=lambda r: r["pid"] != pid)
        again = next_set(sub, lambda m: names(m) == ["b-test-node"], epoch_not=epoch)
        assert again.errors and again.errors[0]["file"].endswith("bad.yaml")
    finally:
        sub.close()

    log = handle.paths.logs_dir / "source-file.log"
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    invalid = [e for e in events if e.get("event") == "source.pod.invalid"]
    assert invalid and invalid[0]["file"].endswith("bad.yaml") and invalid[0]["field"] == "kind"


def test_source_http_process_publishes_the_url_set(agent: Any,
                                                   zctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = {"value": POD.format(name="h").encode()}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body["value"])))
            self.end_headers()
            self.wfile.write(body["value"])

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    config = {
        "nodeName": "test-node",
        "staticPodURL": f"http://127.0.0.1:{httpd.server_address[1]}/pods",
        "httpCheckFrequency": "1s",
        "supervision": {
            "builtins": False, "heartbeatInterval": "200ms", "shutdownTimeout": "15s",
            "processes": {"source-http": {"module": "podvisor.services.sources.http_main",
                                          "heartbeatTimeout": "3s", "stopTimeout": "2s"}},
        },
    }
    try:
        handle = agent(config=config)
        sub = SetReader(zctx, handle.paths, "http")
        try:
            msg = next_set(sub, lambda m: names(m) == ["h-test-node"])
            assert msg.source == "http"
            body["value"] = b""
            next_set(sub, lambda m: m.pods == [] and m.errors == [])
        finally:
            sub.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)
