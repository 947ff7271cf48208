"""What the API source keeps of an API pod's status (issue 24): the conditions other
controllers own (a readiness gate's) and a Failed phase with its reason and message (the sync
loop never runs such a pod again: it was evicted, ran past its deadline or was rejected);
nothing of the agent's own status, so its writes do not come back as changes."""

from __future__ import annotations

from typing import Any

from podvisor.services.sources.api_source import SetBuilder


def api_pod(uid: str, status: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": uid, "namespace": "default", "uid": uid,
                         "resourceVersion": "1", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]},
            "status": status}


def test_kept_of_the_status_gates_and_a_failed_phase() -> None:
    running = api_pod("u1", {"phase": "Running", "podIP": "10.0.0.1", "conditions": [
        {"type": "Ready", "status": "True"}, {"type": "example.com/lb", "status": "True"}]})
    evicted = api_pod("u2", {"phase": "Failed", "reason": "Evicted",
                             "message": "The node was low on resource: memory.",
                             "containerStatuses": [{"name": "c"}]})
    got = {p.uid: p.status for p in SetBuilder().build([running, evicted]).pods.pods}
    assert got["u1"] == {"conditions": [{"type": "example.com/lb", "status": "True"}]}
    assert got["u2"] == {"phase": "Failed", "reason": "Evicted",
                         "message": "The node was low on resource: memory."}
