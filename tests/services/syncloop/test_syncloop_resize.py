"""In-place resize, pure parts: the decision (fits / Infeasible / Deferred, the API server's
rules for pods of other sources), the plan per resource and resizePolicy, the container hash
without CPU and memory, the restart through compute_pod_actions, and the allocation checkpoint
(it survives a restart of its owner: a new store on the same file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from podvisor.common.logs import MemoryLogger
from podvisor.services.pod import Pod, container_hash, legacy_container_hash, pod_from_dict
from podvisor.services.syncloop.actions import RESIZE_RESTART, compute_pod_actions
from podvisor.services.syncloop.admission import Capacity
from podvisor.services.syncloop.allocation import AllocationStore
from podvisor.services.syncloop.backoff import BackoffPolicy, CrashBackoff
from podvisor.services.syncloop.resize import (
    MEMORY_DECREASE,
    QOS_MESSAGE,
    REMOVAL,
    Verdict,
    allocated_pod,
    amounts,
    decide,
    plan,
    pod_amounts,
    to_quantities,
)
from podvisor.services.syncloop.runtime_state import (
    ContainerInfo,
    ContainerState,
    PodRuntime,
    SandboxInfo,
)

CAP = Capacity(cpu_millis=4000, memory_bytes=4 << 30, pods=110)
MI = 1 << 20


def res(cpu: str, cpu_lim: str | None, mem: str, mem_lim: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"requests": {"cpu": cpu, "memory": mem}}
    limits = {k: v for k, v in (("cpu", cpu_lim), ("memory", mem_lim)) if v is not None}
    if limits:
        out["limits"] = limits
    return out


def make_pod(*containers: dict[str, Any], uid: str = "u1") -> Pod:
    return pod_from_dict({"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": f"p-{uid}", "namespace": "default", "uid": uid},
                          "spec": {"containers": list(containers)}}).pod


def ctr(name: str, resources: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "host", "resources": resources, **extra}


RESTART_MEMORY = [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]


def base() -> Pod:
    return make_pod(ctr("a", res("500m", "1", "256Mi", "512Mi")),
                    ctr("b", res("500m", "1", "256Mi", "512Mi"), resizePolicy=RESTART_MEMORY))


def changed(pod: Pod, name: str, resources: dict[str, Any]) -> Pod:
    raw = pod.to_dict()
    for c in raw["spec"]["containers"]:
        if c["name"] == name:
            c["resources"] = resources
    return pod_from_dict(raw).pod


# -- the decision --------------------------------------------------------------------------------

def test_an_unchanged_spec_needs_no_decision() -> None:
    pod = base()
    assert decide(pod, pod, [], CAP, api=True).verdict is Verdict.NONE


def test_a_resize_that_fits_is_accepted() -> None:
    pod = base()
    bigger = changed(pod, "a", res("1", "2", "512Mi", "1Gi"))
    assert decide(bigger, pod, [], CAP, api=True).verdict is Verdict.ACCEPT


def test_more_than_the_node_has_is_infeasible_with_the_kubelets_message() -> None:
    pod = base()
    d = decide(changed(pod, "a", res("5", "5", "256Mi", "512Mi")), pod, [], CAP, api=True)
    assert d.verdict is Verdict.INFEASIBLE
    assert d.message == "Node didn't have enough capacity: cpu, requested: 5500, capacity: 4000"
    d = decide(changed(pod, "a", res("500m", "1", "5Gi", "5Gi")), pod, [], CAP, api=True)
    assert d.message == (f"Node didn't have enough capacity: memory, requested: "
                         f"{(5 << 30) + 256 * MI}, capacity: {4 << 30}")


def test_what_fits_the_node_but_not_beside_the_others_is_deferred() -> None:
    pod = base()
    other = make_pod(ctr("x", res("2500m", None, "1Gi", None)), uid="u2")
    d = decide(changed(pod, "a", res("1500m", "2", "256Mi", "512Mi")), pod, [other], CAP,
               api=True)
    assert d.verdict is Verdict.DEFERRED
    assert d.message == ("Node didn't have enough resource: cpu, requested: 2000, used: 2500, "
                         "capacity: 4000")
    # the others are counted with their allocation, the pod itself never
    assert decide(changed(pod, "a", res("1500m", "2", "256Mi", "512Mi")), pod, [pod], CAP,
                  api=True).verdict is Verdict.ACCEPT


def test_others_are_not_read_when_there_is_nothing_to_decide() -> None:
    def boom() -> Any:
        raise AssertionError("read")
        yield  # pragma: no cover
    pod = base()
    assert decide(pod, pod, boom(), CAP, api=True).verdict is Verdict.NONE


@pytest.mark.parametrize("name, resources, why", [
    ("a", res("500m", "1", "256Mi", "256Mi"), MEMORY_DECREASE),  # NotRequired memory
    ("a", {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"cpu": "1"}}, REMOVAL),
])
def test_the_api_servers_rules_hold_for_pods_of_other_sources(name: str,
                                                              resources: dict[str, Any],
                                                              why: str) -> None:
    pod = base()
    want = changed(pod, name, resources)
    d = decide(want, pod, [], CAP, api=False)
    assert (d.verdict, d.message) == (Verdict.INFEASIBLE, why)


def test_a_memory_decrease_with_restart_container_is_allowed() -> None:
    pod = base()
    want = changed(pod, "b", res("500m", "1", "256Mi", "384Mi"))
    assert decide(want, pod, [], CAP, api=False).verdict is Verdict.ACCEPT


def test_a_qos_class_change_is_infeasible() -> None:
    pod = make_pod(ctr("a", res("1", "1", "1Gi", "1Gi")))  # Guaranteed
    want = changed(pod, "a", res("500m", "1", "1Gi", "1Gi"))  # Burstable
    for api in (False, True):
        d = decide(want, pod, [], CAP, api=api)
        assert (d.verdict, d.message) == (Verdict.INFEASIBLE, QOS_MESSAGE)


# -- the plan ------------------------------------------------------------------------------------

def running(pod: Pod, name: str, cid: str) -> ContainerInfo:
    c = next(c for c in pod.spec.containers if c.name == name)
    return ContainerInfo(cid, name, "s1", ContainerState.RUNNING, container_hash(c), 0, 1)


def test_plan_updates_or_restarts_per_changed_resource_and_policy() -> None:
    old = base()
    rt = PodRuntime((SandboxInfo("s1", True, 0, 1),),
                    (running(old, "a", "ca"), running(old, "b", "cb")))
    actual = {"ca": amounts(old.spec.containers[0].resources),
              "cb": amounts(old.spec.containers[1].resources)}
    assert plan(old, rt, actual).empty
    # CPU of both: NotRequired for CPU everywhere -> both updated in place
    cpu = changed(changed(old, "a", res("1", "2", "256Mi", "512Mi")), "b",
                  res("1", "2", "256Mi", "512Mi"))
    p = plan(cpu, rt, actual)
    assert (p.update, p.restart) == ((("ca", "a"), ("cb", "b")), ())
    # memory of b: RestartContainer -> restarted; a's memory: in place
    mem = changed(changed(old, "a", res("500m", "1", "256Mi", "1Gi")), "b",
                  res("500m", "1", "256Mi", "1Gi"))
    p = plan(mem, rt, actual)
    assert (p.update, p.restart) == ((("ca", "a"),), ("cb",))
    # a container the checkpoint does not know runs with its allocation: nothing to do
    assert plan(mem, rt, {}).empty


def test_a_resize_restart_kills_and_starts_the_container_without_back_off() -> None:
    pod = base()
    rt = PodRuntime((SandboxInfo("s1", True, 0, 1),),
                    (running(pod, "a", "ca"), running(pod, "b", "cb")))
    backoff = CrashBackoff(BackoffPolicy(initial=10, cap=300, reset_after=600))
    actions = compute_pod_actions(pod, rt, 100.0, backoff, resize_restart=("cb",))
    assert [(k.container_id, k.reason) for k in actions.kill] == [("cb", RESIZE_RESTART)]
    assert [(s.name, s.restart_count) for s in actions.start] == [("b", 1)]
    assert not actions.waiting


# -- the hash ------------------------------------------------------------------------------------

def test_the_hash_leaves_cpu_and_memory_out_but_not_the_rest() -> None:
    pod = base()
    a = pod.spec.containers[0]
    bigger = changed(pod, "a", res("1", "2", "1Gi", "2Gi")).spec.containers[0]
    assert container_hash(bigger) == container_hash(a)
    assert legacy_container_hash(bigger) != legacy_container_hash(a)
    huge = changed(pod, "a", {**res("500m", "1", "256Mi", "512Mi"),
                              "limits": {"cpu": "1", "memory": "512Mi",
                                         "hugepages-2Mi": "4Mi"}}).spec.containers[0]
    assert container_hash(huge) != container_hash(a)  # not resizable in place


def test_a_container_made_before_resize_is_adopted_while_its_resources_hold() -> None:
    pod = base()
    a = pod.spec.containers[0]
    old = ContainerInfo("ca", "a", "s1", ContainerState.RUNNING, legacy_container_hash(a), 0, 1)
    rt = PodRuntime((SandboxInfo("s1", True, 0, 1),), (old, running(pod, "b", "cb")))
    backoff = CrashBackoff(BackoffPolicy(initial=10, cap=300, reset_after=600))
    assert compute_pod_actions(pod, rt, 100.0, backoff).noop


# -- the pod with its allocation, quantities ------------------------------------------------------

def test_allocated_pod_replaces_cpu_and_memory_only() -> None:
    pod = base()
    want = changed(pod, "a", res("1", "2", "1Gi", "2Gi"))
    back = allocated_pod(want, pod_amounts(pod))
    assert pod_amounts(back) == pod_amounts(pod)
    assert allocated_pod(pod, pod_amounts(pod)) is pod
    assert to_quantities(pod_amounts(pod)["a"]) == {
        "requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}


# -- the checkpoint ------------------------------------------------------------------------------

def test_the_allocation_checkpoint_survives_its_owner(tmp_path: Path) -> None:
    path = tmp_path / "allocation.json"
    log = MemoryLogger()
    store = AllocationStore(path, log)
    pod = base()
    store.set_allocated("u1", pod_amounts(pod))
    store.set_actuated("u1", "a", "ca", pod_amounts(pod)["a"])
    again = AllocationStore(path, log)  # a new sync loop after kill -9
    assert again.allocated("u1") == pod_amounts(pod)
    assert again.actuated("u1") == {"a": ("ca", pod_amounts(pod)["a"])}
    assert not list(tmp_path.glob("*.tmp"))  # written whole, renamed into place
    again.forget("u1")
    assert AllocationStore(path, log).allocated("u1") is None


def test_an_unreadable_checkpoint_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "allocation.json"
    path.write_text("{not json")
    assert AllocationStore(path, MemoryLogger()).uids() == set()
    path.write_text(json.dumps({"version": 99, "allocated": {"u": {}}}))
    assert AllocationStore(path, MemoryLogger()).uids() == set()


# -- the sync loop over the CRI fake -------------------------------------------------------------

def _manifest(uid: str, resources: dict[str, Any], policy: list[dict[str, str]] | None = None,
              name: str = "p") -> dict[str, Any]:
    from tests.services.syncloop.test_podworkers import published
    c: dict[str, Any] = {"name": "c", "image": "host", "command": ["sleep", "9"],
                         "resources": resources}
    if policy:
        c["resizePolicy"] = policy
    return published({"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": name, "namespace": "default", "uid": uid},
                      "spec": {"terminationGracePeriodSeconds": 2, "containers": [c]}})


class _Loop:
    def __init__(self, tmp: Path, store_path: Path) -> None:
        from tests.services.syncloop.test_syncloop_network import Harness
        self.h = Harness(tmp, gate=False)
        self.store = AllocationStore(store_path, self.h.log)
        from dataclasses import replace

        from podvisor.services.pod import NodeFacts
        from podvisor.services.syncloop.loop import SyncLoop
        sync = replace(self.h.sync, allocation=self.store,
                       node=NodeFacts(cpu_millis=2000, memory_bytes=2 << 30))
        self.h.loop = SyncLoop(replace(self.h.loop.deps, sync=sync))

    def container(self) -> Any:
        from cri_api.v1 import api_pb2 as pb
        [c] = [c for c in self.h.cri.list_containers() if c.state == pb.CONTAINER_RUNNING]
        return c


def test_the_sync_loop_resizes_in_place_and_says_so_in_desired(tmp_path: Path) -> None:
    loop = _Loop(tmp_path, tmp_path / "allocation.json")
    h = loop.h
    h.loop.handle_pod_set("file", [_manifest("u1", res("100m", "200m", "64Mi", "128Mi"))], h.now)
    h.run_for(2.0)
    first = loop.container()
    assert h.desired.items["u1"].resize.allocated["c"]["limits"] == {"cpu": "200m",
                                                                     "memory": "128Mi"}
    h.loop.handle_pod_set("file", [_manifest("u1", res("200m", "400m", "64Mi", "256Mi"))], h.now)
    h.loop.step(h.now)  # decided and handed out: in progress until the sync reports
    h.run_for(2.0)
    assert loop.container().id == first.id  # the same container
    [(cid, linux)] = h.cri.method_calls("UpdateContainerResources")
    assert cid == first.id
    assert (linux.cpu_quota, linux.memory_limit_in_bytes) == (40_000, 256 * MI)
    resize = h.desired.items["u1"].resize
    assert resize.actual["c"]["limits"] == {"cpu": "400m", "memory": "256Mi"}
    assert not resize.in_progress and not resize.pending_reason
    [accepted] = h.log.named("syncloop.pod.resize.accepted")
    assert accepted["pod_uid"] == "u1"
    [completed] = h.log.named("syncloop.pod.resize.completed")  # the ResizeCompleted event
    assert completed["message"] == (
        'Pod resize completed: {"containers":[{"name":"c","resources":{"limits":{"cpu":"400m",'
        '"memory":"256Mi"},"requests":{"cpu":"200m","memory":"64Mi"}}}]}')


def test_an_infeasible_resize_is_pending_and_the_pod_runs_on(tmp_path: Path) -> None:
    loop = _Loop(tmp_path, tmp_path / "allocation.json")
    h = loop.h
    h.loop.handle_pod_set("file", [_manifest("u1", res("100m", "200m", "64Mi", "128Mi"))], h.now)
    h.run_for(2.0)
    first = loop.container()
    h.loop.handle_pod_set("file", [_manifest("u1", res("3", "3", "64Mi", "128Mi"))], h.now)
    h.run_for(5.0)
    assert loop.container().id == first.id
    assert not h.cri.method_calls("UpdateContainerResources")
    resize = h.desired.items["u1"].resize
    assert (resize.pending_reason, resize.pending_message) == (
        "Infeasible", "Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000")
    assert resize.allocated["c"]["limits"]["cpu"] == "200m"
    assert len(h.log.named("syncloop.pod.resize.pending")) == 1  # said once
    assert not h.log.named("syncloop.pod.resize.completed")


def test_restart_container_policy_restarts_with_the_new_limit(tmp_path: Path) -> None:
    loop = _Loop(tmp_path, tmp_path / "allocation.json")
    h = loop.h
    h.loop.handle_pod_set("file", [_manifest("u1", res("100m", "200m", "64Mi", "128Mi"),
                                             RESTART_MEMORY)], h.now)
    h.run_for(2.0)
    first = loop.container()
    h.loop.handle_pod_set("file", [_manifest("u1", res("100m", "200m", "64Mi", "256Mi"),
                                             RESTART_MEMORY)], h.now)
    h.run_for(3.0)
    second = loop.container()
    assert second.id != first.id and second.metadata.attempt == 1
    assert not h.cri.method_calls("UpdateContainerResources")
    [(_sandbox_id, config, _sandbox)] = [c for c in h.cri.method_calls("CreateContainer")
                                         if c[1].metadata.attempt == 1]
    assert config.linux.resources.memory_limit_in_bytes == 256 * MI


def test_a_restarted_sync_loop_applies_what_it_had_accepted(tmp_path: Path) -> None:
    """kill -9 between the allocation and UpdateContainerResources: the next sync loop reads
    the checkpoint, finds the container behind its allocation, and updates it."""
    path = tmp_path / "allocation.json"
    loop = _Loop(tmp_path, path)
    h = loop.h
    h.loop.handle_pod_set("file", [_manifest("u1", res("100m", "200m", "64Mi", "128Mi"))], h.now)
    h.run_for(2.0)
    first = loop.container()
    # accepted, not applied: what a crash right after the decision leaves on disk
    bigger = pod_from_dict(_manifest("u1", res("200m", "400m", "64Mi", "256Mi"))).pod
    loop.store.set_allocated("u1", pod_amounts(bigger))
    from dataclasses import replace

    from podvisor.services.syncloop.loop import SyncLoop
    again = AllocationStore(path, h.log)
    h.loop = SyncLoop(replace(h.loop.deps, sync=replace(h.loop.deps.sync, allocation=again)))
    h.loop.handle_pod_set("file", [_manifest("u1", res("200m", "400m", "64Mi", "256Mi"))], h.now)
    h.run_for(2.0)
    assert loop.container().id == first.id
    [(cid, linux)] = h.cri.method_calls("UpdateContainerResources")
    assert cid == first.id and linux.memory_limit_in_bytes == 256 * MI
    assert again.actuated("u1")["c"] == (first.id, pod_amounts(bigger)["c"])


def test_sidecars_are_resized_and_run_to_completion_init_containers_are_not() -> None:
    raw = base().to_dict()
    raw["spec"]["initContainers"] = [
        {"name": "setup", "image": "host", "resources": res("100m", "1", "64Mi", "64Mi")},
        {"name": "proxy", "image": "host", "restartPolicy": "Always",
         "resources": res("100m", "1", "64Mi", "64Mi"), "resizePolicy": RESTART_MEMORY}]
    pod = pod_from_dict(raw).pod
    assert set(pod_amounts(pod)) == {"proxy", "a", "b"}
    raw["spec"]["initContainers"][1]["resources"] = res("100m", "1", "64Mi", "128Mi")
    want = pod_from_dict(raw).pod
    back = allocated_pod(want, pod_amounts(pod))
    assert back.spec.init_containers[1].resources == pod.spec.init_containers[1].resources
    proxy = ContainerInfo("cp", "proxy", "s1", ContainerState.RUNNING,
                          container_hash(pod.spec.init_containers[1]), 0, 3)
    rt = PodRuntime((SandboxInfo("s1", True, 0, 1),),
                    (running(pod, "a", "ca"), running(pod, "b", "cb"), proxy))
    actual = {"cp": amounts(pod.spec.init_containers[1].resources)}
    p = plan(want, rt, actual)
    assert (p.update, p.restart) == ((), ("cp",))  # memory: RestartContainer
    backoff = CrashBackoff(BackoffPolicy(initial=10, cap=300, reset_after=600))
    setup = ContainerInfo("cs", "setup", "s1", ContainerState.EXITED,
                          container_hash(pod.spec.init_containers[0]), 0, 5)
    rt = PodRuntime(rt.sandboxes, (*rt.containers, setup))
    actions = compute_pod_actions(want, rt, 100.0, backoff, resize_restart=p.restart)
    assert [(k.container_id, k.reason) for k in actions.kill] == [("cp", RESIZE_RESTART)]
    assert [s.name for s in actions.start] == ["proxy"]


def test_allocations_of_pods_gone_while_no_sync_loop_ran_are_forgotten(tmp_path: Path) -> None:
    path = tmp_path / "allocation.json"
    AllocationStore(path, MemoryLogger()).set_allocated("gone", {"c": {"limits": {"cpu": 1}}})
    loop = _Loop(tmp_path, path)
    h = loop.h
    h.loop.handle_pod_set("file", [_manifest("u1", res("100m", "200m", "64Mi", "128Mi"))], h.now)
    h.run_for(3.0)  # a housekeeping once the source's set is in
    assert AllocationStore(path, h.log).uids() == {"u1"}
    h.loop.handle_pod_set("file", [], h.now)
    h.run_for(5.0)  # terminated: its allocation goes with it
    assert AllocationStore(path, h.log).uids() == set()
