"""Pod workers: the worker table (coalescing, kills, requeue) and SyncLoop over the CRI fake."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.common.logs import MemoryLogger
from podvisor.services.cri.errors import CriError
from podvisor.services.cri.fake import FakeRuntimeClient
from podvisor.services.pod import Pod, pod_from_dict
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.backoff import BackoffPolicy, CrashBackoff, SharedBackoff
from podvisor.services.syncloop.loop import RUNTIME_PROBE_INTERVAL, LoopDeps, SyncLoop
from podvisor.services.syncloop.podconfig import new_pod_config
from podvisor.services.syncloop.states import WorkerState
from podvisor.services.syncloop.syncpod import IN_FLIGHT_RETRY, SyncDeps
from podvisor.services.syncloop.workers import Outcome, Timing, WorkerTable, WorkKind


def manifest(name: str = "p", uid: str = "u1", containers: list[dict[str, Any]] | None = None,
             **spec: Any) -> dict[str, Any]:
    containers = containers or [{"name": "a", "image": "host", "command": ["sleep", "100"]},
                                {"name": "b", "image": "host", "command": ["sleep", "200"]}]
    return published({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"containers": containers, **spec}})


def published(manifest: dict[str, Any]) -> dict[str, Any]:
    """As a source publishes a pod: validated once, its wire form (``Pod.to_dict()``)."""
    return pod_from_dict(manifest).pod.to_dict()


def pod(**kw: Any) -> Pod:
    return pod_from_dict(manifest(**kw)).pod


# --- the worker table -------------------------------------------------------------------------

def table() -> WorkerTable:
    return WorkerTable(Timing(resync=60, error_delay=10, jitter=0.5), rand=lambda: 1.0)


def test_updates_to_a_busy_worker_coalesce_latest_wins() -> None:
    t = table()
    t.update(pod(), "file", 0.0)
    [work] = t.due(0.0)
    t.update(pod(containers=[{"name": "a", "image": "host", "command": ["v2"]}]), "file", 1.0)
    t.update(pod(containers=[{"name": "a", "image": "host", "command": ["v3"]}]), "file", 2.0)
    assert t.due(2.0) == []                      # one piece of work per pod at a time
    t.finish(work, Outcome(ok=True), 3.0)
    [again] = t.due(3.0)
    assert again.pod is not None and again.pod.spec.containers[0].command == ("v3",)


def test_kill_is_never_overwritten_and_grace_only_shrinks() -> None:
    t = table()
    t.update(pod(grace=30), "file", 0.0)
    t.kill("u1", 20, 0.0)
    t.kill("u1", 25, 1.0)
    t.update(pod(), "file", 1.0)                # the source wants it again: wait for the kill
    [work] = t.due(1.0)
    assert (work.kind, work.grace) == (WorkKind.TERMINATE, 20)
    w = t.finish(work, Outcome(ok=True), 2.0)
    assert w is not None and w.state is WorkerState.SYNCING  # restarted from scratch
    assert [x.kind for x in t.due(2.0)] == [WorkKind.SYNC]


def test_requeue_after_success_error_and_runtime_down() -> None:
    t = table()
    t.update(pod(), "file", 0.0)
    [work] = t.due(0.0)
    w = t.finish(work, Outcome(ok=True), 0.0)
    assert w is not None and w.next_at == 90.0           # 60 s * (1 + 0.5 * 1.0)
    w.pending = True
    [work] = t.due(0.0)
    w = t.finish(work, Outcome(ok=True, retry_after=5.0), 0.0)
    assert w is not None and w.next_at == 5.0            # a back-off ends first
    w.pending = True
    [work] = t.due(0.0)
    w = t.finish(work, Outcome(ok=False, error="x"), 0.0)
    assert w is not None and w.next_at == 15.0           # 10 s * 1.5
    delays = []
    for _ in range(8):
        w.pending = True
        [work] = t.due(t.runtime_down_until)
        now = t.runtime_down_until
        t.finish(work, Outcome(ok=False, runtime_down=True), now)
        delays.append(round(t.runtime_delay, 3))
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert t.due(t.runtime_down_until - 0.01) == []       # nothing runs while it is down


def test_failures_of_one_outage_double_the_runtime_back_off_once() -> None:
    """Forty pods whose work was in flight when the runtime died fail together: the back-off
    is that of one failed try (100 ms), not of forty (it reached its 5 s cap, and every pod
    waited that long after the runtime was back)."""
    t = table()
    for i in range(40):
        t.update(pod(uid=f"u{i}"), "file", 0.0)
    works = t.due(0.0)
    assert len(works) == 40
    for i, work in enumerate(works):
        t.finish(work, Outcome(ok=False, runtime_down=True), 0.001 * i)
    assert t.runtime_delay == 0.1
    assert max(w.next_at for w in t.workers.values()) <= 0.04 + 0.1
    retry = t.due(t.runtime_down_until)
    for work in retry:  # the retries fail too: now it doubles
        t.finish(work, Outcome(ok=False, runtime_down=True), t.runtime_down_until)
    assert t.runtime_delay == 0.2


def test_errors_just_after_the_runtime_came_back_are_retried_soon() -> None:
    """containerd restarted after a kill -9 fails a create or two on what its crash left
    (a snapshot directory its rolled-back metadata hands out again): within recovery_window
    of the runtime answering again such errors retry at recovery_retry, not error_delay (a pod
    waited 10-15 s after containerd was back); later errors wait error_delay again."""
    t = table()
    t.update(pod(uid="a"), "file", 0.0)
    t.update(pod(uid="b"), "file", 0.0)
    for work in t.due(0.0):
        t.finish(work, Outcome(ok=False, runtime_down=True), 0.0)
    [wa, wb] = t.due(t.runtime_down_until)
    back = t.runtime_down_until
    t.finish(wa, Outcome(ok=True), back)  # the runtime answers again
    t.finish(wb, Outcome(ok=False, error="failed to rename: file exists"), back + 0.01)
    b = t.get("b")
    assert b is not None and b.next_at == back + 0.01 + t.timing.recovery_retry
    [wb] = t.due(b.next_at)
    late = back + t.timing.recovery_window
    t.finish(wb, Outcome(ok=False, error="CreateContainerError"), late)
    assert b.next_at == late + t.timing.error_delay * 1.5  # table(): rand() = 1.0


def test_the_loop_deadline_is_one_due_would_act_on() -> None:
    """next_deadline is the poll timeout of the loop: a deadline ``due`` would not act on
    (the runtime is down, the pod was refused admission) used to be 0, a busy spin."""
    t = table()
    t.update(pod(), "file", 0.0)
    [work] = t.due(0.0)
    t.finish(work, Outcome(ok=False, runtime_down=True), 0.0)
    w = t.get("u1")
    assert w is not None
    w.pending = True  # an event for the pod while the runtime is down
    assert t.due(0.05) == [] and t.next_deadline() == t.runtime_down_until > 0.05
    refused = table()
    refused.reject(pod(), "file", "HostPortConflict", "port 80 is taken")
    r = refused.get("u1")
    assert r is not None
    r.pending = True
    assert refused.due(0.0) == [] and refused.next_deadline() is None


def test_an_overdue_housekeeping_still_running_does_not_spin_the_loop(tmp_path: Path) -> None:
    """While housekeeping runs on a pool thread (queued behind a burst of syncs, it can take
    seconds), its past deadline is not a poll timeout: its result wakes the loop."""
    h = Harness(tmp_path)
    held: list[Callable[[], None]] = []
    h.loop.deps = replace(h.loop.deps, submit=held.append)
    h.loop.step(h.now)  # hands out housekeeping (held: not run yet)
    assert len(held) == 1
    h.now += 60.0  # long overdue
    assert h.loop.step(h.now) is None  # no pods, housekeeping busy: nothing to wake for
    held.pop()()  # it finishes; the next step applies its result and hands out the next one
    assert h.loop.step(h.now) is None and len(held) == 1


def test_pleg_trigger_makes_pod_due_now() -> None:
    t = table()
    t.update(pod(), "file", 0.0)
    [work] = t.due(0.0)
    t.finish(work, Outcome(ok=True), 0.0)
    assert t.due(1.0) == []
    t.trigger("u1", 1.0)
    assert [w.uid for w in t.due(1.0)] == ["u1"]


# --- SyncLoop over the CRI fake ---------------------------------------------------------------

class Desired:
    def __init__(self) -> None:
        self.items: dict[str, Any] = {}

    def set(self, key: str, value: Any) -> bool:
        self.items[key] = value
        return True

    def delete(self, key: str) -> bool:
        return self.items.pop(key, None) is not None


class Harness:
    def __init__(self, tmp: Path, cri: FakeRuntimeClient | None = None,
                 sources: tuple[str, ...] = ("file",)) -> None:
        self.now = 100.0
        self.cri = cri or FakeRuntimeClient(clock=lambda: int((1e9 + self.now) * 1e9))
        self.log = MemoryLogger()
        self.slept: list[float] = []
        self.desired = Desired()
        self.sync = SyncDeps(
            cri=self.cri, pods_dir=tmp / "pods", pod_logs_dir=tmp / "pod-logs",
            backoff=SharedBackoff(CrashBackoff(BackoffPolicy(1, 4, 600))),
            image_backoff=SharedBackoff(CrashBackoff(BackoffPolicy(1, 4, 600))),
            mono=lambda: self.now, wall=lambda: 1e9 + self.now, log=self.log,
            sleep=self.slept.append)
        def run_inline(fn: Callable[[], None]) -> None:
            return fn()
        self.loop = SyncLoop(LoopDeps(
            sync=self.sync, pod_config=new_pod_config(sources),
            table=WorkerTable(Timing(), rand=lambda: 0.0), desired=self.desired,
            submit=run_inline, wake=lambda: None))

    def settle(self, rounds: int = 5) -> None:
        for _ in range(rounds):
            self.loop.step(self.now)

    def set(self, *pods: dict[str, Any]) -> None:
        self.loop.handle_pod_set("file", list(pods), self.now)
        self.settle()

    def running(self) -> dict[str, str]:
        return {c.labels[L.CONTAINER_NAME]: c.id
                for c in self.cri.list_containers() if c.state == pb.CONTAINER_RUNNING}


def test_pod_runs_with_sandbox_config_labels_and_volumes(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    m = manifest(hostNetwork=True, volumes=[{"name": "scratch", "emptyDir": {}}])
    m["spec"]["containers"][0].update(
        env=[{"name": "X", "value": "1"}], workingDir="/tmp",
        volumeMounts=[{"name": "scratch", "mountPath": "/data"}])
    h.set(m)
    assert set(h.running()) == {"a", "b"}
    [(sb_cfg, _handler)] = h.cri.method_calls("RunPodSandbox")
    ns = sb_cfg.linux.security_context.namespace_options
    assert (ns.network, ns.pid, sb_cfg.hostname) == (pb.NODE, pb.CONTAINER, "")
    assert sb_cfg.labels[L.POD_UID] == "u1"
    assert sb_cfg.log_directory.endswith("pod-logs/default_p_u1")
    cfg = h.cri.method_calls("CreateContainer")[0][1]
    assert cfg.linux.security_context.namespace_options.pid == pb.CONTAINER
    assert cfg.annotations[L.RESTART_COUNT] == "0" and cfg.log_path == "a/0.log"
    assert [(e.key, e.value) for e in cfg.envs] == [("X", "1")] and cfg.working_dir == "/tmp"
    vol = tmp_path / "pods/u1/volumes/kubernetes.io~empty-dir/scratch"
    # the volume, then (the kubelet's makeMounts) the container's termination-log file
    assert vol.is_dir() and [m.host_path for m in cfg.mounts][:1] == [str(vol)]
    log = cfg.mounts[1]
    assert (log.container_path, log.readonly) == ("/dev/termination-log", False)
    assert log.host_path.startswith(str(tmp_path / "pods/u1/containers/a/"))
    entry = h.desired.items["u1"]
    assert entry.worker == "syncing" and entry.admitted and entry.sandbox_id


def test_edit_command_replaces_only_that_container(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.set(manifest())
    before = h.running()
    edited = manifest()
    edited["spec"]["containers"][0]["command"] = ["sleep", "101"]
    h.set(edited)
    after = h.running()
    assert after["b"] == before["b"] and after["a"] != before["a"]
    assert [args[0] for args in h.cri.method_calls("StopContainer")] == [before["a"]]


def test_removed_pod_terminates_in_order(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    m = manifest(terminationGracePeriodSeconds=1)
    m["spec"]["containers"][0]["lifecycle"] = {"preStop": {"exec": {"command": ["bye"]}}}
    h.set(m)
    ids = h.running()
    h.cri.calls.clear()
    h.set()
    order = [(name, args[0]) for name, args in h.cri.calls if name in (
        "ExecSync", "StopContainer", "StopPodSandbox", "RemoveContainer", "RemovePodSandbox")]
    sandbox = next(a for n, a in order if n == "StopPodSandbox")
    pos = order.index
    assert pos(("ExecSync", ids["a"])) < pos(("StopContainer", ids["a"]))
    assert pos(("StopContainer", ids["a"])) < pos(("StopPodSandbox", sandbox))
    assert pos(("StopContainer", ids["b"])) < pos(("StopPodSandbox", sandbox))
    assert pos(("StopPodSandbox", sandbox)) < pos(("RemovePodSandbox", sandbox))
    stops = {args[0]: args[1] for args in h.cri.method_calls("StopContainer")}
    assert stops == {ids["a"]: 2, ids["b"]: 2}            # grace 1 s, but never < 2 s
    assert h.cri.method_calls("ExecSync")[0][1] == ("bye",)
    assert not h.cri.containers and not h.cri.sandboxes and "u1" not in h.desired.items


def test_a_pod_first_seen_being_deleted_never_starts(tmp_path: Path) -> None:
    """A pod created and deleted while its source could not see it (the API server away) comes
    in a relist with ``deletionTimestamp``: it is terminated at once, nothing of it is started,
    and its worker ends (status-api then deletes it from the API). Before, it was started and
    never killed."""
    h = Harness(tmp_path)
    m = manifest()
    m["metadata"].update(deletionTimestamp="2024-01-01T00:00:05Z",
                         deletionGracePeriodSeconds=5)
    h.set(published(m))
    assert not h.cri.method_calls("RunPodSandbox") and not h.cri.method_calls("CreateContainer")
    assert "u1" not in h.desired.items and h.loop.deps.table.get("u1") is None


def test_crash_loop_backoff_reported_and_restart_after_delay(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.set(manifest(containers=[{"name": "a", "image": "host"}]))
    for expected_wait in (0, 1, 2, 4, 4):
        cid = h.running()["a"]
        h.cri.exit_container(cid, 1)
        h.loop.handle_pleg_event("u1", h.now)
        h.settle()
        if expected_wait:
            assert "a" not in h.running()
            assert h.desired.items["u1"].waiting["a"].reason == "CrashLoopBackOff"
            h.now += expected_wait + 0.01
            h.settle()
        assert "a" in h.running(), expected_wait
    restarts = [c.annotations[L.RESTART_COUNT] for c in h.cri.list_containers()
                if c.state == pb.CONTAINER_RUNNING]
    assert restarts == ["5"]
    assert len(h.cri.list_containers()) == 2               # dead ones pruned to one


def test_host_port_conflict_rejects_second_pod(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    port = [{"containerPort": 8080, "hostPort": 18080}]
    one = manifest("one", "u1", [{"name": "a", "image": "host", "ports": port}])
    two = manifest("two", "u2", [{"name": "a", "image": "host", "ports": port}])
    h.set(one, two)
    entry = h.desired.items["u2"]
    assert entry.admitted is False and entry.reason == "HostPortConflict"
    assert {s.labels[L.POD_UID] for s in h.cri.list_pod_sandbox()} == {"u1"}


def test_orphans_removed_only_after_sources_ready_and_pods_adopted(tmp_path: Path) -> None:
    first = Harness(tmp_path)
    first.set(manifest("keep", "u1"), manifest("gone", "u2"))
    kept = {c.id for c in first.cri.list_containers() if c.labels[L.POD_UID] == "u1"}
    # a new sync loop (after a restart) over the same runtime
    h = Harness(tmp_path, cri=first.cri)
    h.cri.calls.clear()
    h.settle()
    assert {s.labels[L.POD_UID] for s in h.cri.list_pod_sandbox()} == {"u1", "u2"}
    h.set(manifest("keep", "u1"))
    h.now += 3
    h.settle()
    assert {s.labels[L.POD_UID] for s in h.cri.list_pod_sandbox()} == {"u1"}
    assert h.cri.method_calls("CreateContainer") == []     # adopted, not restarted
    assert {c.id for c in h.cri.list_containers()} == kept


def test_runtime_unavailable_backs_off_then_recovers(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.cri.fail("ListPodSandbox", grpc.StatusCode.UNAVAILABLE, times=3)
    h.loop.handle_pod_set("file", [manifest()], h.now)
    for _ in range(10):
        h.settle(1)
        h.now += 0.5
    assert set(h.running()) == {"a", "b"}


def test_stop_all_terminates_everything_and_admits_nothing(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.set(manifest("one", "u1"), manifest("two", "u2"))
    h.loop.stop_all(h.now)
    h.settle()
    assert h.loop.all_stopped() and not h.cri.containers and not h.cri.sandboxes
    h.set(manifest("one", "u1"), manifest("two", "u2"))
    assert not h.cri.containers


def test_stop_all_in_a_sync_loop_that_knows_no_pod_yet_stops_the_runtimes(
        tmp_path: Path) -> None:
    """stopPodsOnExit right after the sync loop restarted: StopAllPods comes before its sources
    delivered a pod. It still stops every pod the runtime runs (a fresh listing, the sources
    ready or not), and says all stopped only after that listing."""
    first = Harness(tmp_path)
    first.set(manifest("one", "u1"), manifest("two", "u2"))
    assert first.cri.containers
    h = Harness(tmp_path, cri=first.cri)  # the new sync loop: no source has spoken
    h.loop.stop_all(h.now)
    assert not h.loop.all_stopped()  # it knows no pod yet: not "all stopped" before listing
    h.settle()
    assert h.loop.all_stopped() and not h.cri.containers and not h.cri.sandboxes


@pytest.mark.parametrize("policy, code, restarts", [
    ("Always", 0, True), ("OnFailure", 0, False), ("OnFailure", 1, True), ("Never", 1, False)])
def test_restart_policy_over_fake(tmp_path: Path, policy: str, code: int, restarts: bool) -> None:
    h = Harness(tmp_path)
    h.set(manifest(containers=[{"name": "a", "image": "host"}], restartPolicy=policy))
    h.cri.exit_container(h.running()["a"], code)
    h.loop.handle_pleg_event("u1", h.now)
    h.settle()
    assert ("a" in h.running()) is restarts


def test_cri_error_in_sync_is_reported_not_raised(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.cri.fail("CreateContainer", grpc.StatusCode.INTERNAL, "boom", times=1)
    h.set(manifest(containers=[{"name": "a", "image": "host"}]))
    assert h.desired.items["u1"].waiting["a"].reason == "CreateContainerError"
    assert "boom" in h.desired.items["u1"].message
    h.now += 20
    h.settle()
    assert "a" in h.running()
    assert isinstance(CriError("x", grpc.StatusCode.INTERNAL, "y"), Exception)


def test_a_lost_start_is_retried_at_once_on_the_container_created(tmp_path: Path) -> None:
    """StartContainer fails with UNAVAILABLE (the runtime went away): the pod is not put in
    the 10 s error delay (the runtime's fault, not the pod's), and the retry starts the
    container that was created, without a second CreateContainer or a restart counted."""
    h = Harness(tmp_path)
    h.cri.fail("StartContainer", grpc.StatusCode.UNAVAILABLE, "socket closed", times=1)
    h.set(manifest(containers=[{"name": "a", "image": "host"}]))
    assert "a" not in h.running()
    [created] = h.cri.list_containers()
    assert created.state == pb.CONTAINER_CREATED
    h.now += 0.1  # the runtime back-off, not error_delay (10 s)
    h.settle()
    assert h.running() == {"a": created.id}
    assert len(h.cri.method_calls("CreateContainer")) == 1
    assert created.labels[L.CONTAINER_NAME] == "a"
    assert [c.metadata.attempt for c in h.cri.list_containers()] == [0]


def test_the_pods_sync_as_soon_as_the_runtime_answers_again(tmp_path: Path) -> None:
    """containerd is down for seconds (killed, started again): the runtime back-off had grown
    to 3.2 s when it came back, and every pod waited that out. While the runtime is down the
    loop asks CRI Version every RUNTIME_PROBE_INTERVAL (one call at a time, no pod work); its
    first answer ends the back-off and the pods sync at once."""
    h = Harness(tmp_path)
    for method in ("ListPodSandbox", "Version"):
        h.cri.fail(method, grpc.StatusCode.UNAVAILABLE, "connection refused")
    h.set(manifest(containers=[{"name": "a", "image": "host"}]))
    table = h.loop.deps.table
    until = h.now + 3.2
    table.runtime_delay, table.runtime_down_until = 3.2, until  # a long outage

    def pod_reads() -> int:
        return sum(1 for (f,) in h.cri.method_calls("ListPodSandbox") if f is not None)
    h.now += RUNTIME_PROBE_INTERVAL
    h.settle()
    assert not h.running() and pod_reads() == 1  # still down: probes, no pod work
    probes = len(h.cri.method_calls("Version"))
    assert probes >= 1
    h.cri.clear_failures()  # containerd is back
    h.now += RUNTIME_PROBE_INTERVAL
    h.settle()
    assert set(h.running()) == {"a"} and h.now < until - 2.0
    assert len(h.cri.method_calls("Version")) == probes + 1


class ContainerdLikeCri(FakeRuntimeClient):
    """A StartContainer that fails after it began (any failure but UNAVAILABLE, unless the
    message says the container is being started) leaves the container exited, never started,
    with a StartError: as containerd 1.6 does."""

    def start_container(self, container_id: str) -> None:
        try:
            super().start_container(container_id)
        except CriError as err:
            if not err.unavailable and "starting state" not in err.message:
                status = self.containers[container_id][1]
                status.state, status.exit_code = pb.CONTAINER_EXITED, 128
                status.reason, status.message = "StartError", err.message
                status.finished_at = self._clock()
            raise


def sync_loop_killed_in_start(tmp_path: Path, message: str) -> tuple[Harness, str]:
    """A sync loop that dies in StartContainer of "a" (containerd went on and failed the
    start with ``message``), and a new sync loop on the same runtime."""
    first = Harness(tmp_path, cri=ContainerdLikeCri())
    first.cri.fail("StartContainer", grpc.StatusCode.UNKNOWN, message, times=1)
    first.set(manifest(containers=[{"name": "a", "image": "host"}]))
    [cut] = first.cri.list_containers()
    assert cut.state == pb.CONTAINER_EXITED
    again = Harness(tmp_path, cri=first.cri)
    again.now = first.now + 1
    return again, cut.id


def test_a_start_cut_off_by_the_sync_loops_death_is_made_again(tmp_path: Path) -> None:
    """containerd marks a start whose caller went away exited (StartError "context
    canceled"): the next sync loop removes it and creates the same attempt, counting no
    restart (the kubelet counts one)."""
    h, cut = sync_loop_killed_in_start(
        tmp_path, 'failed to start containerd task "x": context canceled: unknown')
    h.cri.calls.clear()
    h.set(manifest(containers=[{"name": "a", "image": "host"}]))
    [running] = h.cri.list_containers()
    assert running.state == pb.CONTAINER_RUNNING and running.id != cut
    assert running.annotations[L.RESTART_COUNT] == "0" and running.metadata.attempt == 0
    assert [args[0] for args in h.cri.method_calls("RemoveContainer")] == [cut]
    assert len(h.cri.method_calls("CreateContainer")) == 1


def test_a_resumed_start_the_runtime_refuses_is_made_again_at_once(tmp_path: Path) -> None:
    """containerd died during StartContainer: the restarted one lists the container created,
    and refuses every start of it (here: the task "already exists"). The resumption's failure
    is not the pod's: the container is replaced by the same attempt in the same sync, no
    restart counted, no error delay."""
    h = Harness(tmp_path, cri=ContainerdLikeCri())
    h.cri.fail("StartContainer", grpc.StatusCode.UNAVAILABLE, "socket closed", times=1)
    h.set(manifest(containers=[{"name": "a", "image": "host"}]))
    [created] = h.cri.list_containers()
    h.cri.fail("StartContainer", grpc.StatusCode.ALREADY_EXISTS,
               f"failed to create containerd task: task {created.id}: already exists", times=1)
    h.now += 0.1  # the runtime back-off
    h.settle()
    [running] = h.cri.list_containers()
    assert running.state == pb.CONTAINER_RUNNING and running.id != created.id
    assert running.annotations[L.RESTART_COUNT] == "0" and running.metadata.attempt == 0
    assert [args[0] for args in h.cri.method_calls("RemoveContainer")] == [created.id]


def test_a_resumed_start_of_a_container_being_started_is_retried_soon(tmp_path: Path) -> None:
    """The StartContainer of a killed sync loop still runs in containerd when the new one
    resumes the container: "already in starting state". Nothing is replaced (the old call
    may be starting it right now); the pod is synced again in IN_FLIGHT_RETRY, not error_delay.
    """
    h = Harness(tmp_path, cri=ContainerdLikeCri())
    h.cri.fail("StartContainer", grpc.StatusCode.UNAVAILABLE, "socket closed", times=1)
    h.set(manifest(containers=[{"name": "a", "image": "host"}]))
    [created] = h.cri.list_containers()
    h.cri.fail("StartContainer", grpc.StatusCode.UNKNOWN,
               f'failed to set starting state for container "{created.id}": container is '
               "already in starting state", times=1)
    h.now += 0.1
    h.settle()
    assert not h.cri.method_calls("RemoveContainer") and not h.running()
    w = h.loop.deps.table.get("u1")
    assert w is not None and w.next_at == h.now + IN_FLIGHT_RETRY
    h.now += IN_FLIGHT_RETRY
    h.settle()
    assert h.running() == {"a": created.id}


@pytest.mark.parametrize("method", ["RunPodSandbox", "CreateContainer"])
def test_a_name_reserved_by_a_call_still_running_is_retried_soon(tmp_path: Path,
                                                                  method: str) -> None:
    """containerd answers "name is reserved" while a killed sync loop's RunPodSandbox or
    CreateContainer of the same attempt still runs (or is being undone): retried in
    IN_FLIGHT_RETRY, not after error_delay (10 s)."""
    h = Harness(tmp_path)
    what = "sandbox" if method == "RunPodSandbox" else "container"
    h.cri.fail(method, grpc.StatusCode.UNKNOWN,
               f'failed to reserve {what} name "x_p_default_u1_0": name "x_p_default_u1_0" '
               'is reserved for "abc"', times=1)
    h.set(manifest(containers=[{"name": "a", "image": "host"}]))
    assert not h.running()
    w = h.loop.deps.table.get("u1")
    assert w is not None and w.next_at == h.now + IN_FLIGHT_RETRY
    h.now += IN_FLIGHT_RETRY
    h.settle()
    assert set(h.running()) == {"a"}


def test_work_that_changed_the_runtime_calls_changed_runtime(tmp_path: Path) -> None:
    """The sync loop's hint to PLEG (RelistHint): called for a sync that started containers and
    for a termination, not for a resync that changed nothing."""
    h = Harness(tmp_path)
    hints: list[int] = []
    h.loop.deps.changed_runtime = lambda: hints.append(1)
    h.set(manifest())
    assert set(h.running()) == {"a", "b"} and hints
    hints.clear()
    h.now += 120  # a periodic resync: nothing to change
    h.settle()
    assert not hints
    h.set()
    assert hints and not h.cri.containers


# --- [issue 24] refusals: rejected as the kubelet rejects, a refused update never stops a pod --

def refused(uid: str = "u1", name: str = "p", reason: str = "spec.volumes[0].iscsi: "
            "unsupported volume type") -> dict[str, Any]:
    """An error of a set that names its pod, as the API source reports one."""
    return {"url": f"api:default/{name}", "field": "spec.volumes[0].iscsi", "reason": reason,
            "uid": uid, "name": name, "namespace": "default"}


def test_a_refused_pod_is_rejected_with_a_reason_and_an_event(tmp_path: Path) -> None:
    h = Harness(tmp_path, sources=("api",))
    h.loop.handle_pod_set("api", [], h.now, [refused()])
    h.settle()
    entry = h.desired.items["u1"]
    assert not entry.admitted and entry.reason == "UnsupportedPodSpec"
    assert entry.message == "spec.volumes[0].iscsi: unsupported volume type"
    assert entry.ref.name == "p" and h.cri.method_calls("RunPodSandbox") == []
    [event] = [r for r in h.log.events if r["event"] == "syncloop.pod.rejected"]
    assert event["reason"] == "UnsupportedPodSpec" and event["pod_uid"] == "u1"
    h.loop.handle_pod_set("api", [], h.now, [refused()])  # said once, not per set
    assert len([r for r in h.log.events if r["event"] == "syncloop.pod.rejected"]) == 1
    # valid at last: admitted and run; a pod the source dropped is forgotten
    h.loop.handle_pod_set("api", [manifest()], h.now, [])
    h.settle()
    assert h.desired.items["u1"].admitted and set(h.running()) == {"a", "b"}
    h.loop.handle_pod_set("api", [], h.now, [refused(uid="u2", name="q")])
    h.loop.handle_pod_set("api", [], h.now, [])
    h.settle()
    assert "u2" not in h.desired.items


def test_a_refused_update_leaves_the_running_pod_alone_and_says_so(tmp_path: Path) -> None:
    h = Harness(tmp_path, sources=("api",))
    h.loop.handle_pod_set("api", [manifest()], h.now, [])
    h.settle()
    before = h.running()
    h.loop.handle_pod_set("api", [], h.now, [refused(reason="spec.ephemeralContainers[0]."
                                                            "volumeDevices: not supported")])
    h.settle()
    assert h.running() == before and h.cri.method_calls("StopContainer") == []
    entry = h.desired.items["u1"]
    assert entry.admitted and entry.worker == "syncing"
    assert entry.reason == "UnsupportedPodUpdate"
    assert entry.message == ("the update was refused and the pod runs on as it was: "
                             "spec.ephemeralContainers[0].volumeDevices: not supported")
    assert [r["reason"] for r in h.log.events if r["event"] == "syncloop.pod.update_refused"
            ] == ["UnsupportedPodUpdate"]
    h.now += 100  # resyncs change nothing
    h.settle()
    assert h.running() == before
    h.loop.handle_pod_set("api", [manifest()], h.now, [])  # the source takes it back
    h.settle()
    assert h.desired.items["u1"].reason == "" and h.running() == before


def test_a_status_only_change_reaches_desired_without_a_sync(tmp_path: Path) -> None:
    h = Harness(tmp_path, sources=("api",))
    h.loop.handle_pod_set("api", [manifest(readinessGates=[{"conditionType": "x/lb"}])],
                          h.now, [])
    h.settle()
    calls = len(h.cri.calls)
    gated = manifest(readinessGates=[{"conditionType": "x/lb"}])
    gated["status"] = {"conditions": [{"type": "x/lb", "status": "True"}]}
    h.loop.handle_pod_set("api", [gated], h.now, [])
    assert h.desired.items["u1"].pod["status"]["conditions"][0]["type"] == "x/lb"
    h.loop.step(h.now)
    assert len(h.cri.calls) == calls  # RECONCILE: no sync


def test_fail_pod_stops_it_for_good_with_its_reason(tmp_path: Path) -> None:
    """[issue 24] ``fail_pod``: the one way a pod ends Failed with a reason (the sync loop's
    activeDeadlineSeconds uses it; another process sends a ``FailPod``, as eviction will): its
    containers stop within the given grace, none restarts, ``desired`` says failed with the
    reason and message, and a ``syncloop.pod.failed`` line carries them to an Event. The pod's
    neighbours are untouched."""
    h = Harness(tmp_path)
    h.set(manifest(terminationGracePeriodSeconds=30), manifest("two", "u2"))

    def running(uid: str) -> set[str]:
        return {c.labels[L.CONTAINER_NAME] for c in h.cri.list_containers()
                if c.labels[L.POD_UID] == uid and c.state == pb.CONTAINER_RUNNING}

    assert running("u1") == running("u2") == {"a", "b"}
    message = "The node was low on resource: memory."
    assert h.loop.fail_pod("u1", "Evicted", message, grace=5)
    h.settle()
    assert running("u1") == set() and running("u2") == {"a", "b"}
    assert {args[1] for args in h.cri.method_calls("StopContainer")} == {5}  # its grace
    entry = h.desired.items["u1"]
    assert entry.failed and entry.admitted and (entry.reason, entry.message) == (
        "Evicted", message)
    [line] = [r for r in h.log.events if r["event"] == "syncloop.pod.failed"]
    assert (line["reason"], line["message"], line["event_type"], line["pod_uid"]) == (
        "Evicted", message, "Warning", "u1")
    assert not h.loop.fail_pod("u1", "Other", "x")  # failed already: said once, kept
    assert not h.loop.fail_pod("nope", "Evicted", "x")  # not a pod it runs
    h.now += 100  # resyncs and an update of the pod restart nothing
    h.set(manifest(terminationGracePeriodSeconds=20), manifest("two", "u2"))
    h.settle()
    assert running("u1") == set() and h.desired.items["u1"].reason == "Evicted"
    assert not h.desired.items["u2"].failed


def test_an_api_pod_failed_in_the_api_never_runs_again(tmp_path: Path) -> None:
    """[issue 24] A pod the API says is Failed (evicted, past its deadline) is terminal: a
    restarted sync loop (a fresh one here) starts none of its containers and keeps its reason,
    with no second Event; the pod beside it runs. A running API pod whose API status turns
    Failed (a status-only change) is stopped the same way."""
    h = Harness(tmp_path, sources=("api",))
    gone = manifest("evicted", "u1")
    gone["status"] = {"phase": "Failed", "reason": "Evicted", "message": "low on memory"}
    h.loop.handle_pod_set("api", [gone, manifest("web", "u2")], h.now, [])
    h.settle()
    entry = h.desired.items["u1"]
    assert entry.failed and (entry.reason, entry.message) == ("Evicted", "low on memory")
    sandboxes = {s.metadata.uid for s in h.cri.list_pod_sandbox()}
    assert sandboxes == {"u2"} and not h.desired.items["u2"].failed
    assert not [r for r in h.log.events if r["event"] == "syncloop.pod.failed"]
    web = manifest("web", "u2")
    web["status"] = {"phase": "Failed", "reason": "DeadlineExceeded", "message": "late"}
    h.loop.handle_pod_set("api", [gone, web], h.now, [])
    h.settle()
    assert h.running() == {} and h.desired.items["u2"].reason == "DeadlineExceeded"
