"""Admission against the Node's allocatable (OutOfpods, OutOfcpu, OutOfmemory): unit tests of
the pure ``admit`` with the kubelet's messages."""

from __future__ import annotations

from typing import Any

from podvisor.services.pod import Pod, pod_from_dict
from podvisor.services.syncloop.admission import Capacity, admit, pod_requests


def pod(name: str, cpu: str = "", memory: str = "", init_cpu: str = "") -> Pod:
    def res(c: str, m: str) -> dict[str, Any]:
        req = {k: v for k, v in (("cpu", c), ("memory", m)) if v}
        return {"requests": req} if req else {}

    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i",
                                            "resources": res(cpu, memory)}]}
    if init_cpu:
        spec["initContainers"] = [{"name": "i", "image": "i", "resources": res(init_cpu, "")}]
    return pod_from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": "default", "uid": name}, "spec": spec}).pod


CAP = Capacity(cpu_millis=2000, memory_bytes=1 << 30, pods=3)


def test_requests_are_max_of_sum_and_largest_init() -> None:
    assert pod_requests(pod("a", cpu="500m", memory="64Mi")) == (500, 64 << 20)
    assert pod_requests(pod("b", cpu="500m", init_cpu="1")) == (1000, 0)


def test_out_of_pods_cpu_memory_with_kubelet_messages() -> None:
    running = [pod("a", cpu="1"), pod("b", cpu="500m", memory="512Mi")]
    assert admit(pod("ok", cpu="500m"), running, CAP) is None
    cpu = admit(pod("big", cpu="600m"), running, CAP)
    assert cpu is not None and cpu.reason == "OutOfcpu"
    assert cpu.message == ("Node didn't have enough resource: cpu, requested: 600, used: 1500, "
                           "capacity: 2000")
    mem = admit(pod("fat", memory="600Mi"), running, CAP)
    assert mem is not None and mem.reason == "OutOfmemory"
    full = admit(pod("d"), [*running, pod("c")], CAP)
    assert full is not None and full.reason == "OutOfpods"
    assert full.message == ("Node didn't have enough resource: pods, requested: 1, used: 3, "
                            "capacity: 3")
    # a pod without requests fits whatever the others use; standalone (no capacity): no check
    assert admit(pod("free"), running, CAP) is None
    assert admit(pod("huge", cpu="64"), running, None) is None


def test_under_node_pressure_new_pods_are_refused_as_the_kubelets_eviction_admit_handler(
) -> None:
    """MemoryPressure alone refuses BestEffort pods only (not one tolerating the
    memory-pressure taint); any other condition refuses every pod but a critical one."""
    besteffort, burstable = pod("be"), pod("bu", memory="64Mi")
    memory = ("MemoryPressure",)
    assert admit(burstable, [], pressure=memory) is None
    refused = admit(besteffort, [], pressure=memory)
    assert refused is not None and (refused.reason, refused.message) == (
        "Evicted", "The node had condition: [MemoryPressure]. ")
    tolerant = pod_from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "t", "namespace": "default", "uid": "t"}, "spec": {
        "containers": [{"name": "c", "image": "i"}], "tolerations": [
            {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists",
             "effect": "NoSchedule"}]}}).pod
    assert admit(tolerant, [], pressure=memory) is None
    disk = admit(burstable, [], pressure=("MemoryPressure", "DiskPressure"))
    assert disk is not None and disk.message == (
        "The node had condition: [MemoryPressure DiskPressure]. ")
    critical = pod_from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "k", "namespace": "kube-system", "uid": "k"}, "spec": {
        "priority": 2000001000, "containers": [{"name": "c", "image": "i"}]}}).pod
    assert admit(critical, [], pressure=("DiskPressure",)) is None
    assert admit(besteffort, [], pressure=()) is None


def test_while_the_node_shuts_down_every_new_pod_is_refused_as_the_kubelets_shutdown_manager(
) -> None:
    """The kubelet's nodeshutdown ``Admit``: reason NodeShutdown, its message; a critical pod
    too (no exemption there), and after the other handlers (a host port clash says so)."""
    critical = pod_from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "k", "namespace": "kube-system", "uid": "k"}, "spec": {
        "priority": 2000001000, "containers": [{"name": "c", "image": "i"}]}}).pod
    for p in (pod("be"), pod("bu", cpu="100m", memory="64Mi"), critical):
        refused = admit(p, [], CAP, shutting_down=True)
        assert refused is not None and (refused.reason, refused.message) == (
            "NodeShutdown", "Pod was rejected as the node is shutting down.")
    assert admit(pod("be"), [], CAP, shutting_down=False) is None
    full = admit(pod("d"), [pod("a"), pod("b"), pod("c")], CAP, shutting_down=True)
    assert full is not None and full.reason == "OutOfpods"  # the resource fit comes first
