"""``services/status/reconcile.py``: when the API's copy of a pod status differs from
podvisor's by the kubelet's rule (``needsReconcile``), and the strategic merge patch that
writes podvisor's over it (applied here with the stand-in's patch code, which follows
k8s.io/apimachinery's strategicpatch): after it the copy is in sync, whatever it held, and the
conditions of other owners are still there."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from podvisor.ipc.podstatus import (
    ContainerState,
    ContainerStatus,
    PodCondition,
    PodStatus,
    Running,
    Terminated,
    Waiting,
)
from podvisor.services.status.reconcile import WRITTEN, differences, status_patch, terminal_in_api
from tests.support.kubeapi.patch import strategic_merge_patch

T0 = "2025-05-01T10:00:00Z"


def cond(ctype: str, status: str = "True", reason: str = "", at: str = T0) -> PodCondition:
    return PodCondition(ctype, status, reason, "", at)


def ours(ready: bool = True, ip: str = "10.88.0.5") -> PodStatus:
    """A running pod of two containers, as podvisor computes it."""
    running = ContainerState(running=Running(T0))
    return PodStatus(
        phase="Running", host_ip="192.0.2.10", host_ips=("192.0.2.10",), start_time=T0,
        qos_class="BestEffort", pod_ip=ip, pod_ips=(ip,) if ip else (),
        container_statuses=(
            ContainerStatus("a", "img", "img@sha", 0, ready, True, "containerd://a", running),
            ContainerStatus("b", "img", "img@sha", 1, ready, True, "containerd://b", running,
                            ContainerState(terminated=Terminated(1, "Error", T0, T0,
                                                                 "containerd://b0")))),
        conditions=(cond("PodReadyToStartContainers"), cond("Initialized"),
                    cond("Ready", "True" if ready else "False",
                         "" if ready else "ContainersNotReady"),
                    cond("ContainersReady", "True" if ready else "False",
                         "" if ready else "ContainersNotReady"),
                    cond("PodScheduled")))


def applied(api: dict[str, Any], status: PodStatus) -> dict[str, Any]:
    """The API's copy after the patch (as kube-apiserver applies it)."""
    pod = {"metadata": {"uid": "u"}, "status": copy.deepcopy(api)}
    patched = strategic_merge_patch(pod, {"metadata": {"uid": "u"},
                                          "status": status_patch(status, api)})
    return dict(patched["status"])


def gate(status: str = "True") -> dict[str, Any]:
    return {"type": "example.com/gate", "status": status, "lastProbeTime": None,
            "lastTransitionTime": T0}


def test_podvisors_own_write_is_in_sync() -> None:
    assert differences(ours().to_dict(), ours()) == []


def test_the_node_lifecycle_controllers_ready_false_differs() -> None:
    api = ours().to_dict()
    ready = next(c for c in api["conditions"] if c["type"] == "Ready")
    ready.update(status="False", lastTransitionTime="2025-05-01T10:01:00Z")
    assert differences(api, ours()) == ["conditions.Ready"]
    fixed = applied(api, ours())
    assert differences(fixed, ours()) == []
    assert [c["status"] for c in fixed["conditions"] if c["type"] == "Ready"] == ["True"]


def test_what_the_kubelet_does_not_count() -> None:
    """Other owners' conditions and fields, times (compared to the second, conditions' not at
    all), fields left empty (the API drops them), the order of container statuses, a QoS class
    the API set when podvisor has none."""
    api = ours().to_dict()
    api["conditions"] = [gate(), *reversed(api["conditions"])]
    for c in api["conditions"]:
        c["lastTransitionTime"] = "2025-05-01T11:11:11Z"  # the scheduler's PodScheduled time
    api["nominatedNodeName"] = "other"
    api["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "gpu-1"}]
    api["startTime"] = "2025-05-01T10:00:00.123456789Z"
    api["containerStatuses"].reverse()
    api["initContainerStatuses"] = []  # omitempty
    del api["containerStatuses"][1]["lastState"]  # a's, empty: omitempty
    assert differences(api, ours()) == []
    mine = PodStatus(**{**ours().__dict__, "qos_class": ""})
    assert differences(api, mine) == []


@pytest.mark.parametrize(("field", "value"), [
    ("phase", "Pending"), ("podIP", "10.88.0.9"), ("message", "evicted"),
    ("hostIPs", [{"ip": "192.0.2.99"}]), ("observedGeneration", 3),
])
def test_a_field_of_podvisors_or_nobodys_differs_and_the_patch_puts_it_right(
        field: str, value: Any) -> None:
    api = {**ours().to_dict(), field: value}
    assert differences(api, ours()) == [field]
    assert differences(applied(api, ours()), ours()) == []


def test_container_statuses_are_replaced_whole() -> None:
    api = ours().to_dict()
    api["containerStatuses"][0]["state"] = {"waiting": {"reason": "ContainerCreating"}}
    api["containerStatuses"].append({"name": "ghost", "ready": False, "restartCount": 0,
                                     "image": "x", "imageID": "", "state": {}})
    assert differences(api, ours()) == ["containerStatuses"]
    fixed = applied(api, ours())
    assert fixed["containerStatuses"] == [c.to_dict() for c in ours().container_statuses]


def test_the_patch_keeps_other_owners_conditions_and_deletes_the_kubelets_podvisor_lacks() -> None:
    """A rejected pod has PodScheduled only: the API's other kubelet-owned conditions go; the
    readiness gate's (not the kubelet's) stays, even one the patch's author never saw."""
    api = ours().to_dict()
    api["conditions"].append(gate())
    api["podIPs"] = [{"ip": "10.88.0.5"}, {"ip": "fd00::5"}]
    rejected = PodStatus(phase="Failed", host_ip="192.0.2.10", host_ips=("192.0.2.10",),
                         start_time=T0, qos_class="BestEffort", reason="OutOfcpu",
                         message="Node didn't have enough resource: cpu",
                         conditions=(cond("PodScheduled"),))
    body = status_patch(rejected, api)
    later = {**api, "conditions": [*api["conditions"], gate() | {"type": "later.io/x"}]}
    fixed = dict(strategic_merge_patch({"status": later}, {"status": body})["status"])
    assert sorted(c["type"] for c in fixed["conditions"]) == [
        "PodScheduled", "example.com/gate", "later.io/x"]
    assert "podIPs" not in fixed and "podIP" not in fixed and fixed["containerStatuses"] == []
    assert differences(fixed, rejected) == []


def test_without_a_copy_the_patch_writes_podvisors_fields_only() -> None:
    body = status_patch(ours(ip=""), None)
    assert set(body) == {*WRITTEN, "conditions"}
    assert body["podIPs"] is None and body["podIP"] == ""
    assert body["hostIPs"] == [{"ip": "192.0.2.10"}, {"$patch": "replace"}]
    assert all("$patch" not in c for c in body["conditions"])


def test_every_field_podvisor_writes_is_in_the_vocabulary() -> None:
    full = PodStatus(phase="Failed", host_ip="h", host_ips=("h",), start_time=T0,
                     qos_class="Burstable", reason="r", message="m", pod_ip="p",
                     pod_ips=("p",),
                     container_statuses=(ContainerStatus(
                         "a", state=ContainerState(waiting=Waiting("x"))),),
                     init_container_statuses=(ContainerStatus("i"),),
                     ephemeral_container_statuses=(ContainerStatus("dbg"),),
                     conditions=(cond("Ready"),))
    assert set(full.to_dict()) == {*WRITTEN, "conditions"}


def test_a_terminal_phase_in_the_api_cannot_be_left() -> None:
    api = {**ours().to_dict(), "phase": "Failed"}
    assert terminal_in_api(api, ours())
    assert not terminal_in_api(ours().to_dict(), ours())
    done = PodStatus(**{**ours().__dict__, "phase": "Succeeded"})
    assert not terminal_in_api(api, done)


def test_ephemeral_statuses_are_written_and_a_stale_gate_is_never_written_back() -> None:
    """[issue 24] ``ephemeralContainerStatuses`` (kubectl debug) are podvisor's to write: the
    patch deleted them before. A readiness gate's condition podvisor's status carries (as the
    sync loop last saw the pod, for /pods) may be older than the API's: the patch leaves it
    out, so the controller's newer value stays."""
    running = ContainerState(running=Running(T0))
    mine = PodStatus(**{**ours().__dict__, "ephemeral_container_statuses": (
        ContainerStatus("dbg", "img", "img@sha", 0, False, None, "containerd://d", running),),
        "conditions": (PodCondition("example.com/gate", "False", "", "", T0),
                       *ours().conditions)})
    api = ours().to_dict()
    api["conditions"].append(gate("True"))
    fixed = applied(api, mine)
    assert [c["name"] for c in fixed["ephemeralContainerStatuses"]] == ["dbg"]
    assert [c["status"] for c in fixed["conditions"] if c["type"] == "example.com/gate"] == [
        "True"]
    assert differences(fixed, mine) == []
