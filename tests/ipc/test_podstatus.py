"""The typed PodStatus (ipc/podstatus.py): the API's JSON exactly as podvisor writes it, read back
to an equal value, and what it rejects."""

from __future__ import annotations

from typing import Any

import pytest

from podvisor.ipc.maps import MapValueError
from podvisor.ipc.podstatus import (
    ContainerState,
    ContainerStatus,
    PodCondition,
    PodStatus,
    Running,
    Terminated,
    Waiting,
)

RUNNING: dict[str, Any] = {
    "hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}], "startTime": "2024-05-01T12:00:00Z",
    "qosClass": "BestEffort", "phase": "Running", "podIP": "10.88.0.5",
    "containerStatuses": [{
        "name": "app", "image": "host", "imageID": "sha256:x", "restartCount": 2,
        "ready": True, "started": True, "containerID": "embedded://c2",
        "state": {"running": {"startedAt": "2024-05-01T12:00:05Z"}},
        "lastState": {"terminated": {
            "exitCode": 137, "reason": "Error", "startedAt": "2024-05-01T12:00:01Z",
            "finishedAt": None, "containerID": "embedded://c1", "message": "oom"}}}],
    "initContainerStatuses": [{
        "name": "init", "image": "host", "imageID": "", "restartCount": 0, "ready": False,
        "started": False, "state": {"waiting": {"reason": "PodInitializing"}},
        "lastState": {}}],
    "podIPs": [{"ip": "10.88.0.5"}, {"ip": "fd00::5"}],
    "conditions": [
        {"type": "Ready", "status": "True", "lastProbeTime": None,
         "lastTransitionTime": "2024-05-01T12:00:06Z"},
        {"type": "Initialized", "status": "False", "lastProbeTime": None,
         "reason": "ContainersNotInitialized", "message": "containers with incomplete status",
         "lastTransitionTime": "2024-05-01T12:00:00Z"}],
}
REJECTED: dict[str, Any] = {
    "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}], "startTime": "2024-05-01T12:00:00Z",
    "phase": "Failed", "reason": "OutOfcpu", "message": "", "containerStatuses": [],
    "initContainerStatuses": [],
    "conditions": [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                    "lastTransitionTime": "2024-05-01T12:00:00Z"}],
}


@pytest.mark.parametrize("api", [RUNNING, REJECTED])
def test_the_api_json_reads_back_exactly(api: dict[str, Any]) -> None:
    status = PodStatus.from_dict(api)
    assert status.to_dict() == api
    assert list(status.to_dict()) == list(api)  # the key order podvisor writes, too
    assert PodStatus.from_dict(status.to_dict()) == status


def test_typed_reads() -> None:
    status = PodStatus.from_dict(RUNNING)
    app = status.container("app")
    assert app is not None and app.runtime_id == "c2" and app.state.kind == "running"
    assert app.last_state.terminated == Terminated(137, "Error", "2024-05-01T12:00:01Z", None,
                                                   "embedded://c1", "oom")
    init = status.container("init")
    assert init is not None and init.state.reason == "PodInitializing"
    assert init.last_state == ContainerState() and init.last_state.kind == ""
    ready = status.condition("Ready")
    assert ready is not None and ready.true and status.condition("PodScheduled") is None
    assert status.pod_ips == ("10.88.0.5", "fd00::5")
    rejected = PodStatus.from_dict(REJECTED)
    assert rejected.reason == "OutOfcpu" and rejected.message == "" and rejected.pod_ip is None


def test_defaults_and_what_is_left_out() -> None:
    """An empty (or older) status reads with defaults; unset optional fields stay out."""
    assert PodStatus.from_dict({}) == PodStatus() and PodStatus().phase == "Pending"
    assert PodStatus().to_dict() == {"hostIP": "", "hostIPs": [], "phase": "Pending",
                                     "containerStatuses": [], "initContainerStatuses": [],
                                     "conditions": []}
    assert Waiting().to_dict() == {} and Running().to_dict() == {"startedAt": None}
    assert ContainerStatus("a").to_dict()["state"] == {}
    assert PodCondition("Ready", "False").to_dict() == {"type": "Ready", "status": "False",
                                                        "lastProbeTime": None}


@pytest.mark.parametrize("raw", [
    [], {"phase": 1}, {"hostIPs": [{"ip": 1}]}, {"hostIPs": {}}, {"conditions": [[]]},
    {"containerStatuses": [{"name": "a", "ready": "yes"}]},
    {"containerStatuses": [{"name": "a", "state": {"running": []}}]},
    {"containerStatuses": [{"name": "a", "state": {"terminated": {"exitCode": "1"}}}]},
    {"initContainerStatuses": [{"name": "a", "lastState": {"waiting": {"reason": 3}}}]},
    {"startTime": 5},
])
def test_malformed_statuses_are_rejected(raw: Any) -> None:
    with pytest.raises(MapValueError) as err:
        PodStatus.from_dict(raw)
    assert err.value.reason == "fields"
