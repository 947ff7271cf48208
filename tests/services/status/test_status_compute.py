"""compute_pod_status and get_phase: phases, conditions, container statuses, versions. The
statuses are checked as the API's JSON (what ``GET /pods`` shows and the API writer patches)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from podvisor.common.timefmt import rfc3339
from podvisor.ipc.maps import ContainerWaiting, DesiredPod, PlegPod, PodRef, PodStatusValue
from podvisor.ipc.podstatus import ContainerStatus
from podvisor.services.pod import pod_from_dict, pod_from_wire
from podvisor.services.status.compute import (
    DESIRED_KEYS,
    compute_pod_status,
    desired_inputs,
    get_phase,
)
from tests.support.plegs import pleg_pod

T0 = 1_700_000_000.0
NS = 1_000_000_000


def pod(containers: list[dict[str, Any]] | None = None, policy: str = "Always",
        init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers or [{"name": "app", "image": "host"}],
                            "restartPolicy": policy}
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-node", "namespace": "default", "uid": "u1"}, "spec": spec}


def desired(p: dict[str, Any] | None = None, **kw: Any) -> DesiredPod:
    # as the sync loop publishes it: the wire form of the pod its source validated
    entry: dict[str, Any] = {"v": 1, "kind": "pod", "pod": pod_from_dict(p or pod()).pod.to_dict(),
                             "source": "file", "worker": "syncing", "admitted": True,
                             "reason": "", "message": "", "waiting": {}}
    entry.update(kw)
    return DesiredPod.from_wire(entry)


class Status(dict[str, Any]):
    """A computed status as the API's JSON, with the value it came from (``value``: the
    ``statuses`` map's, its version and pod)."""

    def __init__(self, value: PodStatusValue) -> None:
        super().__init__(value.status.to_dict())
        self.value = value


def computed(d: DesiredPod, pl: PlegPod | None, previous: Status | None, now: float,
             **kw: Any) -> Status:
    """``compute_pod_status`` of ``d``'s typed pod, as the status engine calls it."""
    return Status(compute_pod_status(d, pod_from_wire(d.pod), pl,
                                     previous.value if previous is not None else None, now,
                                     **kw))


def ctr(cid: str, state: str = "CONTAINER_RUNNING", name: str = "app", created: int = 1,
        exit_code: int = 0, restarts: int = 0, reason: str = "") -> dict[str, Any]:
    return {"id": cid, "name": name, "sandbox_id": "sb1", "attempt": restarts, "state": state,
            "created_at": created * NS, "started_at": (created + 1) * NS,
            "finished_at": (created + 5) * NS if state == "CONTAINER_EXITED" else 0,
            "exit_code": exit_code, "reason": reason, "message": "", "image": "host",
            "image_ref": "sha256:host", "hash": "h", "restart_count": restarts, "log_path": ""}


def pleg(*containers: dict[str, Any], sandbox: str = "SANDBOX_READY", ip: str = "10.0.0.5",
         additional_ips: tuple[str, ...] = (), older: tuple[dict[str, Any], ...] = ()
         ) -> PlegPod:
    return pleg_pod(ts=1.0, sandboxes=[*older, {
        "id": "sb1", "state": sandbox, "created_at": NS, "attempt": 0, "ip": ip,
        "additional_ips": list(additional_ips)}], containers=list(containers))


def conds(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status["conditions"]}


def test_running_pod_is_ready_with_all_conditions() -> None:
    s = computed(desired(), pleg(ctr("c1")), None, T0)
    assert s["phase"] == "Running"
    assert conds(s) == {"PodReadyToStartContainers": "True", "Initialized": "True",
                        "ContainersReady": "True", "Ready": "True", "PodScheduled": "True"}
    assert all(c["lastTransitionTime"] == rfc3339(T0) for c in s["conditions"])
    cs = s["containerStatuses"][0]
    assert cs["name"] == "app" and cs["containerID"] == "embedded://c1"
    assert cs["state"] == {"running": {"startedAt": rfc3339(2)}} and cs["lastState"] == {}
    assert cs["ready"] is True and cs["started"] is True and cs["restartCount"] == 0
    assert cs["image"] == "host" and cs["imageID"] == "sha256:host"
    assert s["podIP"] == "10.0.0.5" and s["startTime"] == rfc3339(T0) and s.value.version == 1
    assert s.value.pod == PodRef("web-node", "default", "u1")
    assert s["initContainerStatuses"] == []


def test_nothing_in_runtime_is_pending_container_creating() -> None:
    s = computed(desired(), None, None, T0)
    assert s["phase"] == "Pending"
    assert s["containerStatuses"][0]["state"] == {"waiting": {"reason": "ContainerCreating"}}
    c = conds(s)
    assert c["PodReadyToStartContainers"] == "False" and c["Ready"] == "False"
    ready = next(x for x in s["conditions"] if x["type"] == "Ready")
    assert ready["reason"] == "ContainersNotReady" and "[app]" in ready["message"]


def test_transition_time_kept_while_unchanged_and_moves_on_change() -> None:
    s1 = computed(desired(), pleg(ctr("c1")), None, T0)
    s2 = computed(desired(), pleg(ctr("c1")), s1, T0 + 50)
    assert s2 == s1 and s2.value == s1.value and s2.value.version == 1
    s3 = computed(desired(), pleg(ctr("c1", "CONTAINER_EXITED", exit_code=1)),
                            s2, T0 + 100)
    assert s3.value.version == 2
    times = {c["type"]: c["lastTransitionTime"] for c in s3["conditions"]}
    assert times["Ready"] == rfc3339(T0 + 100) and times["PodScheduled"] == rfc3339(T0)
    assert s3["startTime"] == rfc3339(T0)


def test_crash_loop_waiting_with_last_state() -> None:
    d = desired(waiting={"app": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}})
    s = computed(d, pleg(ctr("c1", "CONTAINER_EXITED", exit_code=2, restarts=3)),
                           None, T0)
    cs = s["containerStatuses"][0]
    assert cs["state"] == {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}}
    term = cs["lastState"]["terminated"]
    assert term["exitCode"] == 2 and term["reason"] == "Error"
    assert term["containerID"] == "embedded://c1" and cs["restartCount"] == 3
    assert s["phase"] == "Running"  # Always: in the process of restarting


def test_restarted_container_has_previous_as_last_state() -> None:
    old = ctr("c1", "CONTAINER_EXITED", created=1, exit_code=137)
    new = ctr("c2", created=10, restarts=1)
    cs = computed(desired(), pleg(old, new), None, T0)["containerStatuses"][0]
    assert cs["containerID"] == "embedded://c2" and cs["restartCount"] == 1
    assert cs["lastState"]["terminated"]["exitCode"] == 137
    assert cs["lastState"]["terminated"]["containerID"] == "embedded://c1"


def test_waiting_reason_does_not_hide_a_running_container() -> None:
    d = desired(waiting={"app": {"reason": "CrashLoopBackOff"}})
    cs = computed(d, pleg(ctr("c1")), None, T0)["containerStatuses"][0]
    assert "running" in cs["state"]


@pytest.mark.parametrize(("policy", "code", "phase"), [
    ("Always", 0, "Running"), ("Always", 1, "Running"),
    ("OnFailure", 0, "Succeeded"), ("OnFailure", 1, "Running"),
    ("Never", 0, "Succeeded"), ("Never", 1, "Failed"),
])
def test_exited_phase_by_policy(policy: str, code: int, phase: str) -> None:
    d = desired(pod(policy=policy))
    s = computed(d, pleg(ctr("c1", "CONTAINER_EXITED", exit_code=code)), None, T0)
    assert s["phase"] == phase
    assert s["containerStatuses"][0]["state"]["terminated"]["exitCode"] == code
    if phase == "Succeeded":
        ready = next(c for c in s["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "False" and ready["reason"] == "PodCompleted"


def test_terminal_phase_never_goes_back() -> None:
    d = desired(pod(policy="Never"))
    failed = computed(d, pleg(ctr("c1", "CONTAINER_EXITED", exit_code=1)), None, T0)
    assert failed["phase"] == "Failed"
    later = computed(d, pleg(ctr("c2")), failed, T0 + 1)
    assert later["phase"] == "Failed"
    gone = computed(d, None, later, T0 + 2)
    assert gone["phase"] == "Failed"


def test_a_terminal_pod_whose_containers_were_removed_keeps_what_it_reported() -> None:
    """The eviction manager's reclaim removes a Succeeded pod's dead container and sandbox
    (container GC of terminated pods): its status keeps the terminated container state and
    the pod IP it reported, not a "ContainerCreating" waiting state."""
    d = desired(pod(policy="Never"), worker="terminated")
    done = computed(d, pleg(ctr("c1", "CONTAINER_EXITED", exit_code=0), sandbox="SANDBOX_NOTREADY"),
                    None, T0)
    assert done["phase"] == "Succeeded"
    removed = computed(d, None, done, T0 + 1)
    assert removed["phase"] == "Succeeded"
    assert removed["containerStatuses"] == done["containerStatuses"]
    assert removed["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert removed["podIP"] == done["podIP"] == "10.0.0.5"


UNKNOWN = {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                          "message": "The container could not be located when the pod was "
                                     "terminated",
                          "startedAt": None, "finishedAt": None, "containerID": ""}}


def test_a_finished_pod_reports_no_container_waiting_or_running() -> None:
    """The kubelet's TerminatePod: a pod failed before its container started (its deadline
    came first), or whose running container was removed before its exit was seen, reports it
    terminated, ContainerStatusUnknown, exit 137, once nothing of the pod runs; while its
    container still runs (the kill is on its way) it shows running."""
    d = desired(failed=True, reason="DeadlineExceeded", message="past its deadline")
    never = computed(d, pleg(), None, T0)
    assert never["phase"] == "Failed"
    assert never["containerStatuses"][0]["state"] == UNKNOWN
    assert not never["containerStatuses"][0]["ready"]
    assert cond(never, "Ready")["reason"] == "PodFailed"
    stopping = computed(d, pleg(ctr("c1")), None, T0)
    assert "running" in stopping["containerStatuses"][0]["state"]
    killed = computed(d, pleg(ctr("c1", "CONTAINER_EXITED", exit_code=137)), stopping, T0 + 1)
    assert killed["containerStatuses"][0]["state"]["terminated"]["reason"] == "Error"
    # the running container removed before its exit was seen: its last report is not kept
    removed = computed(d, None, stopping, T0 + 2)
    assert removed["containerStatuses"][0]["state"] == UNKNOWN
    assert removed["containerStatuses"][0]["containerID"] == "embedded://c1"


def test_a_finished_pod_that_never_initialized_keeps_its_regular_containers_waiting() -> None:
    """hasPodInitialized / initializedContainers: of the init containers, those up to the last
    that left waiting are terminated (the first at least); regular containers only once the
    pod initialized (the last init container done, or a sidecar last that started)."""
    p = pod(init=[{"name": "i1", "image": "host"}, {"name": "i2", "image": "host"}])
    d = desired(p, failed=True, reason="DeadlineExceeded", message="x")
    s = computed(d, pleg(ctr("x1", "CONTAINER_EXITED", name="i1", exit_code=137)), None, T0)
    i1, i2 = s["initContainerStatuses"]
    assert i1["state"]["terminated"]["reason"] == "Error"
    assert i2["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert s["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    nothing = computed(d, None, None, T0)
    assert nothing["initContainerStatuses"][0]["state"] == UNKNOWN
    waiting = {"waiting": {"reason": "PodInitializing"}}
    assert nothing["initContainerStatuses"][1]["state"] == waiting
    sidecar = pod(init=[{"name": "proxy", "image": "host", "restartPolicy": "Always"}])
    up = computed(desired(sidecar), pleg(ctr("s1", name="proxy")), None, T0)
    assert up["initContainerStatuses"][0]["started"]
    gone = computed(desired(sidecar, failed=True, reason="Evicted", message="x"), None, up,
                    T0 + 1)
    assert gone["initContainerStatuses"][0]["state"] == UNKNOWN
    assert gone["containerStatuses"][0]["state"] == UNKNOWN


def test_mixed_containers_some_running_is_running() -> None:
    p = pod([{"name": "a", "image": "host"}, {"name": "b", "image": "host"}], policy="Never")
    s = computed(desired(p), pleg(ctr("c1", name="a"),
                                            ctr("c2", "CONTAINER_EXITED", name="b", exit_code=1)),
                           None, T0)
    assert s["phase"] == "Running"
    assert conds(s)["ContainersReady"] == "False"


def test_one_container_not_yet_created_is_pending() -> None:
    p = pod([{"name": "a", "image": "host"}, {"name": "b", "image": "host"}])
    s = computed(desired(p), pleg(ctr("c1", name="a")), None, T0)
    assert s["phase"] == "Pending"
    assert [c["name"] for c in s["containerStatuses"]] == ["a", "b"]


def test_init_containers_block_and_report() -> None:
    p = pod(init=[{"name": "i1", "image": "host"}, {"name": "i2", "image": "host"}])
    s = computed(desired(p), pleg(ctr("x1", name="i1")), None, T0)
    assert s["phase"] == "Pending"
    init = next(c for c in s["conditions"] if c["type"] == "Initialized")
    assert init["status"] == "False" and init["reason"] == "ContainersNotInitialized"
    assert init["message"] == "containers with incomplete status: [i1 i2]"
    assert s["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert s["initContainerStatuses"][1]["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert "running" in s["initContainerStatuses"][0]["state"]
    done = pleg(ctr("x1", "CONTAINER_EXITED", name="i1"),
                ctr("x2", "CONTAINER_EXITED", name="i2", created=3), ctr("c1", created=5))
    s2 = computed(desired(p), done, s, T0 + 10)
    assert s2["phase"] == "Running" and conds(s2)["Initialized"] == "True"
    assert s2["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"


def test_init_done_regular_not_yet_created_is_container_creating() -> None:
    p = pod(init=[{"name": "i1", "image": "host"}])
    s = computed(desired(p), pleg(ctr("x1", "CONTAINER_EXITED", name="i1")), None, T0)
    assert conds(s)["Initialized"] == "True" and s["phase"] == "Pending"
    assert s["containerStatuses"][0]["state"] == {"waiting": {"reason": "ContainerCreating"}}


def test_failed_init_with_never_fails_the_pod() -> None:
    p = pod(policy="Never", init=[{"name": "i1", "image": "host"}])
    s = computed(desired(p), pleg(ctr("x1", "CONTAINER_EXITED", name="i1",
                                                exit_code=1)), None, T0)
    assert s["phase"] == "Failed"


def test_failed_init_with_always_stays_pending() -> None:
    p = pod(policy="Always", init=[{"name": "i1", "image": "host"}])
    d = desired(p, waiting={"i1": {"reason": "CrashLoopBackOff"}})
    s = computed(d, pleg(ctr("x1", "CONTAINER_EXITED", name="i1", exit_code=1)),
                           None, T0)
    assert s["phase"] == "Pending"
    assert s["initContainerStatuses"][0]["state"]["waiting"]["reason"] == "CrashLoopBackOff"


def test_admission_rejected_is_failed_with_reason() -> None:
    d = desired(admitted=False, reason="HostPortConflict", message="port 80 in use")
    s = computed(d, None, None, T0)
    assert s["phase"] == "Failed" and s["reason"] == "HostPortConflict"
    # the kubelet's rejectPod: "Pod was rejected: " + the admission message
    assert s["message"] == "Pod was rejected: port 80 in use"
    assert conds(s) == {"PodScheduled": "True"}


def test_readiness_probe_means_not_ready_until_a_prober_says_so() -> None:
    p = pod([{"name": "app", "image": "host", "readinessProbe": {"exec": {"command": ["x"]}}}])
    s = computed(desired(p), pleg(ctr("c1")), None, T0)
    assert s["containerStatuses"][0]["ready"] is False and conds(s)["Ready"] == "False"
    s2 = computed(desired(p), pleg(ctr("c1")), s, T0, readiness={"app": True})
    assert s2["containerStatuses"][0]["ready"] is True and conds(s2)["Ready"] == "True"


def test_startup_probe_means_not_started() -> None:
    p = pod([{"name": "app", "image": "host", "startupProbe": {"exec": {"command": ["x"]}}}])
    cs = computed(desired(p), pleg(ctr("c1")), None, T0)["containerStatuses"][0]
    assert cs["started"] is False


def test_not_ready_sandbox_condition() -> None:
    s = computed(desired(), pleg(ctr("c1"), sandbox="SANDBOX_NOTREADY"), None, T0)
    assert conds(s)["PodReadyToStartContainers"] == "False"


def test_created_container_is_waiting_container_creating() -> None:
    s = computed(desired(), pleg(ctr("c1", "CONTAINER_CREATED")), None, T0)
    assert s["containerStatuses"][0]["state"] == {"waiting": {"reason": "ContainerCreating"}}
    assert s["phase"] == "Pending"


def test_containerd_scheme_and_host_network_ip() -> None:
    p = pod()
    p["spec"]["hostNetwork"] = True
    pl = pleg(ctr("c1"), ip="")
    s = computed(desired(p), pl, None, T0, runtime="containerd", host_ips=("10.1.1.1",))
    assert s["containerStatuses"][0]["containerID"] == "containerd://c1"
    assert s["podIP"] == "10.1.1.1" and s["hostIP"] == "10.1.1.1"


def test_pod_ips_and_host_ips() -> None:
    """podIP/podIPs from the newest sandbox (PodSandboxStatus ip, then additional_ips); a
    hostNetwork pod has the host's whatever the sandbox says; hostIPs always."""
    pl = pleg(ctr("c1"), additional_ips=("fd00::5", "10.0.0.5"))
    s = computed(desired(), pl, None, T0, runtime="containerd", host_ips=("10.1.1.1",))
    assert s["podIP"] == "10.0.0.5"
    assert s["podIPs"] == [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}]
    assert s["hostIP"] == "10.1.1.1" and s["hostIPs"] == [{"ip": "10.1.1.1"}]
    old = {"id": "sb0", "state": "SANDBOX_NOTREADY", "created_at": 0, "attempt": 0, "ip": ""}
    pl = pleg(ctr("c1"), additional_ips=("fd00::5", "10.0.0.5"),
              older=(old,))  # an older dead one (a failed setup) changes nothing
    assert computed(desired(), pl, None, T0)["podIPs"] == s["podIPs"]
    p = pod()
    p["spec"]["hostNetwork"] = True
    s = computed(desired(p), pl, None, T0, host_ips=("10.1.1.1",))
    assert s["podIP"] == "10.1.1.1" and s["podIPs"] == [{"ip": "10.1.1.1"}]
    none = computed(desired(), None, None, T0)  # no sandbox (yet): no IP
    assert none["podIP"] == "" and "podIPs" not in none


def test_pod_level_reason_is_reported() -> None:
    s = computed(desired(reason="Terminating", message="deleted"), pleg(ctr("c1")),
                           None, T0)
    assert s["reason"] == "Terminating" and s["message"] == "deleted"


@pytest.mark.parametrize(("regular", "phase"), [
    ([], "Pending"),
    ([{"running": {}}], "Running"),
    ([{"waiting": {}}], "Pending"),
    ([{"running": {}}, {"waiting": {}}], "Pending"),
])
def test_get_phase_table(regular: list[dict[str, Any]], phase: str) -> None:
    statuses = [{"name": f"c{i}", "state": st, "lastState": {}, "containerID": "x"}
                for i, st in enumerate(regular)]
    assert get_phase("Always", [], [ContainerStatus.from_dict(st) for st in statuses]) == phase


def _recording(entry: DesiredPod, read: set[str]) -> DesiredPod:
    """``entry`` as a ``DesiredPod`` that records which of its fields are read."""
    fields = {f.name for f in dataclasses.fields(DesiredPod)}

    class Recording(DesiredPod):
        def __getattribute__(self, name: str) -> Any:
            if name in fields:
                read.add(name)
            return super().__getattribute__(name)

    return Recording(**{f: getattr(entry, f) for f in fields})


@pytest.mark.parametrize("entry", [
    desired(), desired(admitted=False, reason="OutOfcpu", message="no cpu"),
    desired(reason="Evicted", message="m", waiting={"app": {"reason": "CrashLoopBackOff"}}),
])
def test_desired_keys_are_every_key_a_status_reads(entry: DesiredPod) -> None:
    """The status process recomputes a pod only when one of ``DESIRED_KEYS`` changed."""
    read: set[str] = set()
    computed(_recording(entry, read), pleg(ctr("c1")), None, T0)
    assert read and read <= set(DESIRED_KEYS)
    same = dataclasses.replace(entry, sandbox_id="sb9", updated_at=7.0, worker="running")
    assert desired_inputs(same) == desired_inputs(entry)
    other = dataclasses.replace(entry, waiting={"app": ContainerWaiting("X")})
    assert desired_inputs(other) != desired_inputs(entry)
    assert desired_inputs(None) is None


@pytest.mark.parametrize("wall", [0.0, 0.999, T0, T0 + 0.5, T0 + 59.999, -0.5, 4102444800.25])
def test_rfc3339_is_strftime_at_second_precision(wall: float) -> None:
    assert rfc3339(wall) == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def test_qos_class_and_last_probe_time_as_the_kubelet_shows_them() -> None:
    s = computed(desired(qos_class="Burstable"), pleg(ctr("c1")), None, T0)
    assert s["qosClass"] == "Burstable"
    assert all("lastProbeTime" in c and c["lastProbeTime"] is None for c in s["conditions"])
    rejected = computed(desired(admitted=False, qos_class="BestEffort"), None, None, T0)
    assert rejected["qosClass"] == "BestEffort"
    assert rejected["conditions"][0]["lastProbeTime"] is None
    changed = computed(desired(qos_class="Guaranteed"), pleg(ctr("c1")), s, T0)
    assert changed["qosClass"] == "Guaranteed" and changed.value.version == s.value.version + 1
    assert "qos_class" in DESIRED_KEYS


def test_the_value_keeps_version_and_pod_beside_the_api_status() -> None:
    """No internal keys in the API's PodStatus: the version and the pod are the value's."""
    s = computed(desired(), pleg(ctr("c1")), None, T0)
    assert s.value.version == 1 and s.value.pod == PodRef("web-node", "default", "u1")
    assert "phase" in s and not any(k.startswith("_") for k in s)
    assert PodStatusValue.from_wire(s.value.to_wire()) == s.value


# --- [issue 24] sidecars, ephemeral containers, readiness gates, the active deadline --------

def cond(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == ctype)


SIDE = {"name": "proxy", "image": "host", "restartPolicy": "Always",
        "readinessProbe": {"exec": {"command": ["true"]}}}


def test_a_sidecar_counts_for_phase_initialized_and_containers_ready() -> None:
    d = desired(pod(init=[SIDE, {"name": "setup", "image": "host"}], policy="Never"))
    only_proxy = computed(d, pleg(ctr("p1", name="proxy")), None, T0, readiness={"proxy": False})
    assert only_proxy["phase"] == "Pending"
    assert cond(only_proxy, "Initialized")["message"] == \
        "containers with incomplete status: [setup]"
    init = {c["name"]: c for c in only_proxy["initContainerStatuses"]}
    assert init["proxy"]["started"] and not init["proxy"]["ready"]
    up = pleg(ctr("p1", name="proxy"), ctr("s1", "CONTAINER_EXITED", name="setup", created=2),
              ctr("a1", created=3))
    unready = computed(d, up, None, T0, readiness={"proxy": False})
    assert unready["phase"] == "Running" and conds(unready)["Initialized"] == "True"
    assert cond(unready, "ContainersReady")["message"] == \
        "containers with unready status: [proxy]"
    ready = computed(d, up, None, T0, readiness={"proxy": True})
    assert conds(ready)["Ready"] == "True"
    assert {c["name"]: c["ready"] for c in ready["initContainerStatuses"]} == {
        "proxy": True, "setup": True}  # a finished init container is ready, as the kubelet
    # the app is done, the sidecar still stops: Running; once it stopped: Succeeded
    done = pleg(ctr("p1", name="proxy"), ctr("s1", "CONTAINER_EXITED", name="setup", created=2),
                ctr("a1", "CONTAINER_EXITED", created=3))
    assert computed(d, done, None, T0)["phase"] == "Running"
    over = pleg(ctr("p1", "CONTAINER_EXITED", name="proxy", exit_code=143),
                ctr("s1", "CONTAINER_EXITED", name="setup", created=2),
                ctr("a1", "CONTAINER_EXITED", created=3))
    assert computed(d, over, None, T0)["phase"] == "Succeeded"


def test_ephemeral_container_statuses() -> None:
    p = pod()
    p["spec"]["ephemeralContainers"] = [{"name": "dbg", "image": "host"}]
    d = desired(p)
    creating = computed(d, pleg(ctr("a1")), None, T0)
    [dbg] = creating["ephemeralContainerStatuses"]
    assert dbg["name"] == "dbg" and dbg["state"] == {"waiting": {"reason": "ContainerCreating"}}
    running = computed(d, pleg(ctr("a1"), ctr("d1", name="dbg", created=2)), None, T0)
    [dbg] = running["ephemeralContainerStatuses"]
    assert "running" in dbg["state"] and dbg["ready"] is False
    assert dbg["containerID"] == "embedded://d1"
    assert conds(running)["Ready"] == "True"  # an ephemeral container is not in readiness
    assert "ephemeralContainerStatuses" not in computed(desired(), pleg(ctr("a1")), None, T0)


def test_readiness_gates_hold_ready_until_their_condition_is_true() -> None:
    p = pod()
    p["spec"]["readinessGates"] = [{"conditionType": "example.com/lb"}]
    missing = computed(desired(p), pleg(ctr("a1")), None, T0)
    assert conds(missing)["ContainersReady"] == "True" and conds(missing)["Ready"] == "False"
    assert cond(missing, "Ready")["reason"] == "ReadinessGatesNotReady"
    assert cond(missing, "Ready")["message"] == \
        'corresponding condition of pod readiness gate "example.com/lb" does not exist.'
    p["status"] = {"conditions": [{"type": "example.com/lb", "status": "False",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    false = computed(desired(p), pleg(ctr("a1")), None, T0)
    assert cond(false, "Ready")["message"] == \
        'the status of pod readiness gate "example.com/lb" is not "True", but False'
    # the gate's condition is the controller's: shown as it set it, first
    assert false["conditions"][0] == {"type": "example.com/lb", "status": "False",
                                      "lastProbeTime": None,
                                      "lastTransitionTime": "2026-01-01T00:00:00Z"}
    p["status"]["conditions"][0]["status"] = "True"
    assert conds(computed(desired(p), pleg(ctr("a1")), None, T0))["Ready"] == "True"


def test_a_pod_past_its_deadline_is_failed_with_the_kubelets_reason() -> None:
    d = desired(failed=True, reason="DeadlineExceeded",
                message="Pod was active on the node longer than the specified deadline")
    s = computed(d, pleg(ctr("a1", "CONTAINER_EXITED", exit_code=137)), None, T0)
    assert (s["phase"], s["reason"]) == ("Failed", "DeadlineExceeded")
    assert s["message"] == "Pod was active on the node longer than the specified deadline"
    assert cond(s, "Ready")["reason"] == "PodFailed"


def test_an_evicted_pod_has_the_disruption_target_condition() -> None:
    """A pod failed with reason Evicted (the eviction manager's FailPod): phase Failed with the
    message, and DisruptionTarget True, reason TerminationByKubelet, as the kubelet adds it;
    a pod failed for another reason has none."""
    message = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 9Mi. "
    st = computed(desired(failed=True, reason="Evicted", message=message), None, None, 100.0)
    assert (st["phase"], st["reason"], st["message"]) == ("Failed", "Evicted", message)
    target = [c for c in st["conditions"] if c["type"] == "DisruptionTarget"]
    assert [(c["status"], c["reason"], c["message"]) for c in target] == [
        ("True", "TerminationByKubelet", message)]
    other = computed(desired(failed=True, reason="DeadlineExceeded", message="x"), None, None,
                     100.0)
    assert not [c for c in other["conditions"] if c["type"] == "DisruptionTarget"]


def test_in_place_resize_shows_allocated_and_actual_resources_and_its_conditions() -> None:
    """The kubelet's (1.33) resize status: ``allocatedResources`` (allocated requests),
    ``resources`` (a running container's actual requests and limits), ``PodResizePending``
    while refused, ``PodResizeInProgress`` until applied (reason Error when an update failed),
    neither once done."""
    old = {"requests": {"cpu": "100m", "memory": "64Mi"},
           "limits": {"cpu": "200m", "memory": "128Mi"}}
    new = {"requests": {"cpu": "200m", "memory": "64Mi"},
           "limits": {"cpu": "400m", "memory": "128Mi"}}
    p = pod([{"name": "app", "image": "host", "resources": new}])
    resize = {"allocated": {"app": new}, "actual": {"app": old}, "inProgress": True}
    s = computed(desired(p, resize=resize), pleg(ctr("c1")), None, T0)
    cs = s["containerStatuses"][0]
    assert cs["allocatedResources"] == {"cpu": "200m", "memory": "64Mi"}
    assert cs["resources"] == old
    [progress] = [c for c in s["conditions"] if c["type"] == "PodResizeInProgress"]
    assert progress["status"] == "True" and "reason" not in progress
    failed = {**resize, "error": "UpdateContainerResources failed: no"}
    s = computed(desired(p, resize=failed), pleg(ctr("c1")), s, T0 + 1)
    [progress] = [c for c in s["conditions"] if c["type"] == "PodResizeInProgress"]
    assert (progress["reason"], progress["message"]) == ("Error",
                                                          "UpdateContainerResources failed: no")
    pending = {"allocated": {"app": old}, "actual": {"app": old},
               "pendingReason": "Infeasible",
               "pendingMessage": "Node didn't have enough capacity: cpu, requested: 5000, "
                                 "capacity: 4000"}
    s = computed(desired(p, resize=pending), pleg(ctr("c1")), s, T0 + 2)
    assert conds(s).get("PodResizeInProgress") is None
    [waiting] = [c for c in s["conditions"] if c["type"] == "PodResizePending"]
    assert (waiting["status"], waiting["reason"]) == ("True", "Infeasible")
    done = {"allocated": {"app": new}, "actual": {"app": new}}
    s = computed(desired(p, resize=done), pleg(ctr("c1")), s, T0 + 3)
    assert "PodResizePending" not in conds(s) and "PodResizeInProgress" not in conds(s)
    assert s["containerStatuses"][0]["resources"] == new
    # not running: its allocation
    s = computed(desired(p, resize=done), pleg(ctr("c1", state="CONTAINER_EXITED")), s, T0 + 4)
    assert s["containerStatuses"][0]["resources"] == new
