"""Events to the API (core/v1 Events): created, counted up within 10 minutes instead of
repeated, rate-limited per object (burst 25, a token every 5 min); against the stand-in."""

from __future__ import annotations

from pathlib import Path

from podvisor.services.apiserver import ApiConnection
from podvisor.services.events.apisink import BURST, REFILL, ApiEventSink
from tests.support.kubeapi import KubeApi


def event(message: str, name: str = "web") -> dict[str, object]:
    return {"type": "Normal", "reason": "Started", "message": message, "source": "syncloop",
            "object": {"kind": "Pod", "name": name, "namespace": "default", "uid": "u1"},
            "count": 1}


def test_events_created_aggregated_and_rate_limited(tmp_path: Path) -> None:
    api = KubeApi(tmp_path / "kubeapi")
    api.start()
    try:
        conn = ApiConnection(str(api.kubeconfig(tmp_path / "kc", user="system:node:n1")))
        sink = ApiEventSink(conn, "n1")
        assert sink.send(event("Started container c"), 1000.0) == "created"
        assert sink.send(event("Started container c"), 1010.0) == "counted"
        items, _ = api.store.list("events", "default")
        [ev] = items
        assert ev["count"] == 2 and ev["involvedObject"]["uid"] == "u1"
        assert ev["source"] == {"component": "kubelet", "host": "n1"}
        assert ev["lastTimestamp"] > ev["firstTimestamp"]
        # after the 10 min window the same event is a new Event
        assert sink.send(event("Started container c"), 1000.0 + 700) == "created"
        # spam filter: the bucket of this object is nearly empty now
        results = [sink.send(event(f"m{i}"), 1700.0) for i in range(BURST)]
        assert results.count("dropped") == 1 and sink.dropped == 1
        assert sink.send(event("later"), 1700.0 + REFILL) == "created"
        # a node-level event (a manifest) names the Node
        sink.send({"type": "Warning", "reason": "FailedParse", "message": "bad",
                   "source": "source-file", "object": {"kind": "Manifest", "file": "/m/x"}},
                  1800.0)
        node_events = [e for e in api.store.list("events", "default")[0]
                       if e["involvedObject"]["kind"] == "Node"]
        assert node_events[0]["message"] == "/m/x: bad"
    finally:
        api.stop()
