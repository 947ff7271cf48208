"""Table tests for compute_pod_actions (pure) and the crash back-off."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from podvisor.services.pod import Pod, pod_from_dict
from podvisor.services.syncloop.actions import CRASH_LOOP_BACK_OFF, compute_pod_actions
from podvisor.services.syncloop.backoff import BackoffPolicy, CrashBackoff
from podvisor.services.syncloop.runtime_state import (
    ContainerInfo,
    ContainerState,
    PodRuntime,
    SandboxInfo,
)
from podvisor.services.syncloop.runtime_state import ContainerState as S
from podvisor.services.syncloop.spec import container_hash


def make_pod(containers: list[dict[str, Any]] | None = None, *, uid: str = "u1",
             name: str = "p", init: list[dict[str, Any]] | None = None,
             policy: str = "Always", grace: int = 30, **spec: Any) -> Pod:
    containers = containers or [{"name": "c", "image": "host", "command": ["sleep", "1000"]}]
    body: dict[str, Any] = {"containers": containers, "restartPolicy": policy,
                            "terminationGracePeriodSeconds": grace, **spec}
    if init:
        body["initContainers"] = init
    return pod_from_dict({"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": name, "namespace": "default", "uid": uid},
                          "spec": body}).pod


def spec_hash(pod: Pod, name: str) -> str:
    return container_hash(next(c for c in pod.all_containers() if c.name == name))


_n = [0]


def ctr(pod: Pod, name: str, state: ContainerState, *, exit_code: int = 0, restarts: int = 0,
        finished: float = 0.0, started: float = 0.0, sandbox: str = "s1",
        hash_: str | None = None) -> ContainerInfo:
    _n[0] += 1
    return ContainerInfo(
        id=f"{name}-{_n[0]}", name=name, sandbox_id=sandbox, state=state,
        hash=hash_ if hash_ is not None else spec_hash(pod, name), restart_count=restarts,
        created_at=10_000 - _n[0], exit_code=exit_code, started_at=started,
        finished_at=finished)


def rt(*containers: ContainerInfo, sandboxes: tuple[SandboxInfo, ...] | None = None
       ) -> PodRuntime:
    boxes = sandboxes if sandboxes is not None else (SandboxInfo("s1", True, 0, 1),)
    return PodRuntime(boxes, tuple(containers))


RUN, EXIT, CREATED, UNKNOWN = S.RUNNING, S.EXITED, S.CREATED, S.UNKNOWN
NOW = 1000.0


def fresh() -> CrashBackoff:
    return CrashBackoff(BackoffPolicy(initial=10, cap=300, reset_after=600))


def names(actions: object) -> list[str]:
    return [s.name for s in actions.start]  # type: ignore[attr-defined]


TWO = [{"name": "a", "image": "host"}, {"name": "b", "image": "host"}]
INITS = [{"name": "i1", "image": "host"}, {"name": "i2", "image": "host"}]


def test_no_sandbox_creates_one_and_starts_all() -> None:
    pod = make_pod(TWO)
    a = compute_pod_actions(pod, PodRuntime(), NOW, fresh())
    assert (a.create_sandbox, a.kill_pod, a.attempt) == (True, True, 0)
    assert names(a) == ["a", "b"]
    assert [s.restart_count for s in a.start] == [0, 0]


@pytest.mark.parametrize("boxes, attempt", [
    ((SandboxInfo("s2", False, 3, 2), SandboxInfo("s1", True, 0, 1)), 4),   # newest not ready
    ((SandboxInfo("s2", True, 1, 2), SandboxInfo("s1", True, 0, 1)), 2),    # two ready
])
def test_sandbox_recreated_kills_all_and_restarts_init(boxes: tuple[SandboxInfo, ...],
                                                       attempt: int) -> None:
    pod = make_pod(TWO, init=INITS)
    state = rt(ctr(pod, "a", RUN), ctr(pod, "i2", EXIT), ctr(pod, "i1", EXIT), sandboxes=boxes)
    a = compute_pod_actions(pod, state, NOW, fresh())
    assert a.create_sandbox and a.kill_pod and a.attempt == attempt
    assert names(a) == ["i1"]
    assert a.waiting["a"].reason == "PodInitializing"


def test_all_running_with_right_hash_is_noop() -> None:
    pod = make_pod(TWO)
    a = compute_pod_actions(pod, rt(ctr(pod, "a", RUN), ctr(pod, "b", RUN)), NOW, fresh())
    assert a.noop and not a.waiting


def test_hash_change_kills_and_restarts_only_that_container() -> None:
    pod = make_pod(TWO)
    old = ctr(pod, "a", RUN, hash_="stale", restarts=2)
    a = compute_pod_actions(pod, rt(old, ctr(pod, "b", RUN)), NOW, fresh())
    assert [(k.container_id, k.reason) for k in a.kill] == [(old.id, "container spec changed")]
    assert names(a) == ["a"] and a.start[0].restart_count == 3 and not a.kill_pod


def test_unknown_container_is_killed() -> None:
    pod = make_pod(TWO)
    stray = ctr(make_pod([{"name": "gone", "image": "host"}]), "gone", RUN)
    a = compute_pod_actions(pod, rt(stray, ctr(pod, "a", RUN), ctr(pod, "b", RUN)), NOW, fresh())
    assert [k.container_id for k in a.kill] == [stray.id] and not a.start


def test_liveness_failure_restarts_unless_never() -> None:
    for policy, restart in (("Always", True), ("OnFailure", True), ("Never", False)):
        pod = make_pod(TWO, policy=policy)
        bad = ctr(pod, "a", RUN)
        a = compute_pod_actions(pod, rt(bad, ctr(pod, "b", RUN)), NOW, fresh(),
                                liveness_failed={bad.id})
        assert [k.container_id for k in a.kill] == [bad.id]
        assert names(a) == (["a"] if restart else [])


@pytest.mark.parametrize("policy, code, restart", [
    ("Always", 0, True), ("Always", 1, True),
    ("OnFailure", 0, False), ("OnFailure", 1, True),
    ("Never", 0, False), ("Never", 1, False),
])
def test_restart_policy(policy: str, code: int, restart: bool) -> None:
    pod = make_pod(TWO, policy=policy)
    state = rt(ctr(pod, "a", EXIT, exit_code=code, finished=NOW - 1), ctr(pod, "b", RUN))
    a = compute_pod_actions(pod, state, NOW, fresh())
    assert names(a) == (["a"] if restart else [])
    assert not a.kill_pod  # b still runs


@pytest.mark.parametrize("how", ["unknown", "created, other spec", "created, old sandbox"])
def test_stale_created_or_unknown_container_is_replaced(how: str) -> None:
    pod = make_pod(TWO, policy="Never")
    stale = {"unknown": ctr(pod, "a", UNKNOWN),
             "created, other spec": ctr(pod, "a", CREATED, hash_="other"),
             "created, old sandbox": ctr(pod, "a", CREATED, sandbox="s0")}[how]
    a = compute_pod_actions(pod, rt(stale, ctr(pod, "b", RUN)), NOW, fresh())
    assert [k.container_id for k in a.kill] == [stale.id] and names(a) == ["a"]
    assert [(s.restart_count, s.container_id) for s in a.start] == [(1, "")]


@pytest.mark.parametrize("policy", ["Always", "OnFailure", "Never"])
def test_created_never_started_container_is_started_as_it_is(policy: str) -> None:
    """A create whose StartContainer (or its answer) was lost: that container is started, no
    new attempt, no back-off, nothing killed, under every restart policy."""
    pod = make_pod(TWO, policy=policy)
    created = ctr(pod, "a", CREATED, restarts=2)
    backoff = fresh()
    backoff.record_restart(("u1", "a"), NOW - 1, NOW - 1)  # a back-off running for "a"
    a = compute_pod_actions(pod, rt(created, ctr(pod, "b", RUN)), NOW, backoff)
    assert not a.kill and not a.kill_pod and not a.create_sandbox
    assert [(s.name, s.restart_count, s.container_id, s.previous_finished_at)
            for s in a.start] == [("a", 2, created.id, 0.0)]
    assert "a" not in a.waiting


NOT_THE_CONTAINERS = (
    'failed to start containerd task "x": context canceled: unknown',
    "failed to create containerd task: failed to start shim: start failed: : signal: killed: "
    "unknown",
    "failed to create containerd task: failed to create shim task: failed to start io pipe "
    'copy: unable to copy pipes: containerd-shim: opening w/o fifo "/x/io/1/x-stdout" failed: '
    "context deadline exceeded: unknown")
REFUSED = ("failed to create containerd task: failed to create shim task: OCI runtime create "
           "failed: runc create failed: unable to start container process: exec: \"nope\": "
           "executable file not found in $PATH: unknown")


def cut_off(pod: Pod, name: str, message: str = NOT_THE_CONTAINERS[0],
            **kw: Any) -> ContainerInfo:
    """An exited container whose StartContainer failed with ``message`` (containerd 1.6's
    StartError; by default the one for a call its caller, the sync loop, went away from)."""
    return replace(ctr(pod, name, EXIT, exit_code=128, finished=NOW - 1, **kw),
                   reason="StartError", message=message, never_started="started" not in kw)


@pytest.mark.parametrize("policy", ["Always", "OnFailure", "Never"])
@pytest.mark.parametrize("message", NOT_THE_CONTAINERS)
def test_a_start_that_failed_by_no_fault_of_the_container_is_made_again_as_the_same_attempt(
        policy: str, message: str) -> None:
    """The sync loop was killed during StartContainer (or containerd failed the start itself)
    and containerd marked the container exited (StartError): it never ran. It is removed and
    the same attempt created in its place, under every restart policy, with no back-off and
    no restart counted."""
    pod = make_pod(TWO, policy=policy)
    stale = cut_off(pod, "a", message, restarts=2)
    backoff = fresh()
    backoff.record_restart(("u1", "a"), NOW - 1, NOW - 1)  # a back-off running for "a"
    a = compute_pod_actions(pod, rt(stale, ctr(pod, "b", RUN)), NOW, backoff)
    assert not a.kill and not a.kill_pod and not a.create_sandbox and "a" not in a.waiting
    assert [(s.name, s.restart_count, s.replaces, s.container_id, s.previous_finished_at)
            for s in a.start] == [("a", 2, stale.id, "", 0.0)]


def test_a_create_cut_off_by_containerds_crash_is_made_again_as_the_same_attempt() -> None:
    """containerd died during CreateContainer after recording the container, before its
    status: the restarted containerd lists it unknown, created at 0, never started. It is
    killed (stale), removed, and the same attempt created again: no restart counted."""
    pod = make_pod(TWO)
    lost = replace(ctr(pod, "a", UNKNOWN, exit_code=255, restarts=1), created_at=0,
                   reason="Unknown")
    a = compute_pod_actions(pod, rt(lost, ctr(pod, "b", RUN)), NOW, fresh())
    assert [k.container_id for k in a.kill] == [lost.id]
    assert [(s.name, s.restart_count, s.replaces) for s in a.start] == [("a", 1, lost.id)]


@pytest.mark.parametrize(("reason", "code"), [("Error", 1), ("Unknown", 255)])
def test_a_container_the_runtime_ended_before_it_ever_started_is_made_again(
        reason: str, code: int) -> None:
    """containerd restarted after its crash cut a StartContainer off finds the task's shim
    gone and exits the container (Error, 1, no message) without it ever having started; the
    embedded runtime says Unknown, 255 when a created container's monitor is gone. Neither is
    a failure of the pod: the same attempt is made again."""
    pod = make_pod(TWO)
    lost = replace(ctr(pod, "a", EXIT, exit_code=code, finished=NOW - 1), reason=reason,
                   never_started=True)
    a = compute_pod_actions(pod, rt(lost, ctr(pod, "b", RUN)), NOW, fresh())
    assert not a.kill
    assert [(s.name, s.restart_count, s.replaces) for s in a.start] == [("a", 0, lost.id)]


def test_a_container_created_in_a_sandbox_that_died_is_made_again_in_the_new_one() -> None:
    """containerd killed mid-burst: the pod's sandbox comes back NOTREADY with its container
    created and never started. A new sandbox replaces it; the container cannot start in the
    dead one, so the same attempt is made in the new one in its place (the dead sandbox, empty
    then, goes at the next sync): no restart counted, no second container left beside."""
    pod = make_pod(TWO)
    dead = (SandboxInfo("s1", False, 0, 1),)
    a_created = ctr(pod, "a", CREATED)
    a = compute_pod_actions(pod, rt(a_created, sandboxes=dead), NOW, fresh())
    assert (a.create_sandbox, a.attempt) == (True, 1)
    assert [(s.name, s.restart_count, s.replaces) for s in a.start] == \
        [("a", 0, a_created.id), ("b", 0, "")]


@pytest.mark.parametrize("how", ["refused", "ran before", "unknown, created"])
def test_a_failed_start_that_is_the_containers_counts(how: str) -> None:
    """The kubelet's behaviour where the runtime does not say the attempt was lost: a start
    runc refused (no such executable), a container that ran, an unknown container with a
    creation time: a new attempt, one restart more."""
    pod = make_pod(TWO)
    latest = {"refused": cut_off(pod, "a", REFUSED),
              "ran before": cut_off(pod, "a", started=NOW - 5),
              "unknown, created": ctr(pod, "a", UNKNOWN)}[how]
    a = compute_pod_actions(pod, rt(latest, ctr(pod, "b", RUN)), NOW, fresh())
    assert [(s.name, s.restart_count, s.replaces) for s in a.start] == [("a", 1, "")]


def test_an_init_container_whose_start_was_cut_off_is_no_failed_init() -> None:
    """Under restartPolicy Never a failed init container fails the pod; one whose start was
    cut off never ran: it is made again, the pod goes on."""
    pod = make_pod(init=INITS, policy="Never")
    i1 = ctr(pod, "i1", EXIT, exit_code=0, finished=NOW - 5)
    i2 = cut_off(pod, "i2")
    a = compute_pod_actions(pod, rt(i2, i1), NOW, fresh())
    assert not a.pod_failed and not a.kill_pod
    assert [(s.name, s.init, s.restart_count, s.replaces) for s in a.start] == \
        [("i2", True, 0, i2.id)]


def test_created_never_started_init_container_is_started_as_it_is() -> None:
    pod = make_pod(init=INITS)
    i1 = ctr(pod, "i1", EXIT, exit_code=0, finished=NOW - 5)
    i2 = ctr(pod, "i2", CREATED)
    a = compute_pod_actions(pod, rt(i2, i1), NOW, fresh())
    assert [(s.name, s.init, s.container_id) for s in a.start] == [("i2", True, i2.id)]
    assert not a.kill


def test_all_done_under_never_kills_pod_and_does_not_recreate_sandbox() -> None:
    pod = make_pod(TWO, policy="Never")
    done = rt(ctr(pod, "a", EXIT, exit_code=0), ctr(pod, "b", EXIT, exit_code=1))
    a = compute_pod_actions(pod, done, NOW, fresh())
    assert a.kill_pod and not a.start
    stopped = PodRuntime((SandboxInfo("s1", False, 0, 1),), done.containers)
    b = compute_pod_actions(pod, stopped, NOW, fresh())
    assert not b.create_sandbox and not b.start


def test_onfailure_succeeded_containers_not_rerun_in_new_sandbox() -> None:
    pod = make_pod(TWO, policy="OnFailure")
    state = PodRuntime((SandboxInfo("s1", False, 0, 1),),
                       (ctr(pod, "a", EXIT, exit_code=0), ctr(pod, "b", EXIT, exit_code=2)))
    a = compute_pod_actions(pod, state, NOW, fresh())
    assert a.create_sandbox and names(a) == ["b"]


@pytest.mark.parametrize("have, expect_start, done", [
    ((), ["i1"], False),
    ((("i1", RUN, 0),), [], False),
    ((("i1", EXIT, 0),), ["i2"], False),
    ((("i2", RUN, 0), ("i1", EXIT, 0)), [], False),
    ((("i2", EXIT, 0), ("i1", EXIT, 0)), ["a", "b"], True),
    ((("i1", EXIT, 1),), ["i1"], False),
])
def test_init_containers_in_order(have: tuple[tuple[str, S, int], ...],
                                  expect_start: list[str], done: bool) -> None:
    pod = make_pod(TWO, init=INITS)
    state = rt(*(ctr(pod, n, st, exit_code=code, finished=NOW - 100) for n, st, code in have))
    a = compute_pod_actions(pod, state, NOW, fresh())
    assert names(a) == expect_start
    assert ("a" in a.waiting) is (not done)
    assert all(s.init for s in a.start) is (not done)


def test_failed_init_under_never_fails_pod() -> None:
    pod = make_pod(TWO, init=INITS, policy="Never")
    a = compute_pod_actions(pod, rt(ctr(pod, "i1", EXIT, exit_code=1)), NOW, fresh())
    assert a.pod_failed and a.kill_pod and not a.start


def test_crash_loop_backoff_delays_double_and_cap() -> None:
    pod = make_pod(TWO)
    b = CrashBackoff(BackoffPolicy(initial=10, cap=40, reset_after=600))
    key = (pod.uid, "a")
    t, delays = 0.0, []
    for _ in range(6):
        # the container crashes right after it started; find when it may restart
        finished = t + 1
        state = rt(ctr(pod, "a", EXIT, exit_code=1, finished=finished), ctr(pod, "b", RUN))
        wait = b.remaining(key, finished, finished)
        a = compute_pod_actions(pod, state, finished, b)
        if wait > 0:
            assert names(a) == [] and a.waiting["a"].reason == CRASH_LOOP_BACK_OFF
            assert a.retry_after == pytest.approx(wait)
        t = finished + wait
        a = compute_pod_actions(pod, state, t, b)
        assert names(a) == ["a"]
        b.record_restart(key, finished, t)
        delays.append(wait)
    assert delays == [0, 10, 20, 40, 40, 40]


def test_backoff_resets_after_quiet_period_and_seeds_from_runtime() -> None:
    b = CrashBackoff(BackoffPolicy(initial=10, cap=300, reset_after=600))
    key = ("u", "c")
    b.record_restart(key, 0.0, 0.0)
    b.record_restart(key, 1.0, 11.0)      # next wait 20
    assert b.remaining(key, 12.0, 12.0) == 20
    assert b.remaining(key, 700.0, 700.0) == 0   # finished > 600 s after the last restart
    assert b.record_restart(key, 700.0, 700.0) == 10
    seeded = CrashBackoff(BackoffPolicy(initial=10, cap=300, reset_after=600))
    seeded.seed(key, restart_count=3, started_at=100.0)
    assert seeded.remaining(key, 101.0, 101.0) == 40
    assert seeded.gc(800.0) == 1


# --- [issue 24] sidecars, ephemeral containers, activeDeadlineSeconds ------------------------

SIDECAR = {"name": "side", "image": "host", "restartPolicy": "Always",
           "startupProbe": {"exec": {"command": ["true"]}}}
SETUP = {"name": "setup", "image": "host"}
APP = [{"name": "app", "image": "host"}]


def test_sidecar_starts_first_and_gates_the_next_init_container_on_its_startup_probe() -> None:
    pod = make_pod(APP, init=[SIDECAR, SETUP])
    first = compute_pod_actions(pod, rt(), NOW, fresh())
    assert names(first) == ["side"] and first.start[0].sidecar and first.start[0].init
    assert first.waiting["app"].reason == "PodInitializing"
    side = ctr(pod, "side", RUN)
    waiting = compute_pod_actions(pod, rt(side), NOW, fresh())
    assert names(waiting) == [] and not waiting.kill_pod  # its startup probe has not passed
    up = compute_pod_actions(pod, rt(side), NOW, fresh(), started={side.id})
    assert names(up) == ["setup"] and not up.start[0].sidecar
    done = compute_pod_actions(pod, rt(ctr(pod, "setup", EXIT), side), NOW, fresh(),
                               started={side.id})
    assert names(done) == ["app"] and done.kill == ()


def test_on_the_sidecar_path_a_cut_off_init_container_is_made_again_not_done() -> None:
    """A pod with sidecars takes the kubelet's sidecar path (initactions.py): there too an init
    container whose start was cut off (a lost attempt: exit 0 or not, it never ran) is made
    again as the same attempt in its place under restartPolicy Never, never counted done (the
    app would start before it ran) nor failed (the pod would end)."""
    pod = make_pod(APP, init=[SIDECAR, SETUP], policy="Never")
    side = ctr(pod, "side", RUN)
    setup = cut_off(pod, "setup")
    a = compute_pod_actions(pod, rt(setup, side), NOW, fresh(), started={side.id})
    assert not a.pod_failed and not a.kill_pod
    assert [(s.name, s.init, s.restart_count, s.replaces) for s in a.start] == \
        [("setup", True, 0, setup.id)]


@pytest.mark.parametrize("policy", ["Always", "Never"])
def test_a_sidecar_that_exits_is_restarted_whatever_the_pod_policy(policy: str) -> None:
    pod = make_pod(APP, init=[SIDECAR, SETUP], policy=policy)
    state = rt(ctr(pod, "app", RUN), ctr(pod, "side", EXIT, exit_code=1, restarts=2),
               ctr(pod, "setup", EXIT))
    a = compute_pod_actions(pod, state, NOW, fresh())
    assert names(a) == ["side"] and a.start[0].restart_count == 3 and a.kill == ()
    assert not a.kill_pod  # the app keeps running; the init container is not run again


def test_a_sidecar_whose_liveness_fails_or_spec_changed_is_killed_and_restarted() -> None:
    side = {**SIDECAR, "livenessProbe": {"exec": {"command": ["true"]}}}
    pod = make_pod(APP, init=[side])
    running = ctr(pod, "side", RUN)
    state = rt(ctr(pod, "app", RUN), running)
    a = compute_pod_actions(pod, state, NOW, fresh(), liveness_failed={running.id: "liveness"},
                            started={running.id})
    assert [(k.name, k.reason) for k in a.kill] == [("side", "liveness probe failed")]
    assert names(a) == ["side"]
    changed = rt(ctr(pod, "app", RUN), ctr(pod, "side", RUN, hash_="old"))
    b = compute_pod_actions(pod, changed, NOW, fresh(), started={changed.containers[1].id})
    assert [k.reason for k in b.kill] == ["container spec changed"] and names(b) == ["side"]


def test_when_the_app_is_done_the_pod_ends_sidecars_included() -> None:
    pod = make_pod(APP, init=[SIDECAR], policy="Never")
    side = ctr(pod, "side", RUN)
    a = compute_pod_actions(pod, rt(ctr(pod, "app", EXIT), side), NOW, fresh(),
                            started={side.id})
    assert a.kill_pod and names(a) == []
    # the sidecar died too: it is not started again for a finished pod
    b = compute_pod_actions(pod, rt(ctr(pod, "app", EXIT), ctr(pod, "side", EXIT, exit_code=1)),
                            NOW, fresh())
    assert b.kill_pod and names(b) == []


def test_an_ephemeral_container_is_started_once_and_never_disturbs_the_others() -> None:
    pod = make_pod(APP, ephemeralContainers=[{"name": "dbg", "image": "host",
                                              "targetContainerName": "app"}])
    app = ctr(pod, "app", RUN)
    a = compute_pod_actions(pod, rt(app), NOW, fresh())
    assert names(a) == ["dbg"] and a.start[0].ephemeral and a.kill == () and not a.kill_pod
    dbg = ContainerInfo("dbg-1", "dbg", "s1", RUN, container_hash(
        pod.spec.ephemeral_containers[0].container), 0, 1)
    assert compute_pod_actions(pod, rt(app, dbg), NOW, fresh()).noop  # kept, not "unknown"
    gone = replace(dbg, state=EXIT, exit_code=0)
    assert compute_pod_actions(pod, rt(app, gone), NOW, fresh()).noop  # never restarted
    # even while the pod initializes (SyncPod step 5 comes before the init containers)
    init = make_pod(APP, init=INITS, ephemeralContainers=[{"name": "dbg", "image": "host"}])
    c = compute_pod_actions(init, rt(ctr(init, "i1", RUN)), NOW, fresh())
    assert names(c) == ["dbg"]


def test_past_the_active_deadline_everything_stops_and_nothing_starts() -> None:
    pod = make_pod(APP, init=[SIDECAR], activeDeadlineSeconds=5)
    state = rt(ctr(pod, "app", RUN), ctr(pod, "side", RUN))
    a = compute_pod_actions(pod, state, NOW, fresh(), failed=True)
    assert a.kill_pod and a.pod_failed and a.failed and names(a) == []
    over = rt(ctr(pod, "app", EXIT, exit_code=137),
              sandboxes=(SandboxInfo("s1", False, 0, 1),))
    b = compute_pod_actions(pod, over, NOW, fresh(), failed=True)
    assert b.noop and not b.create_sandbox  # stopped: no new sandbox, no restart
