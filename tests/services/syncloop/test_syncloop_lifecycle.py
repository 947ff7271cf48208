"""SyncPod over the CRI fake for the kubelet's pod lifecycle fields (issue 24): postStart (runs
after the start; a failure kills the container, FailedPostStartHook), an ephemeral container's
target (PID namespace TARGET), the termination-log file mounted on terminationMessagePath,
activeDeadlineSeconds (kill, no restart, a sync at the deadline), sidecars stopped after the
app when the pod is torn down."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from cri_api.v1 import api_pb2 as pb

from podvisor.common.logs import MemoryLogger
from podvisor.services.cri.fake import FakeRuntimeClient
from podvisor.services.events.logbridge import events_for
from podvisor.services.pod import Pod, pod_from_dict
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.backoff import BackoffPolicy, CrashBackoff, SharedBackoff
from podvisor.services.syncloop.runtime_state import read_pod_runtime
from podvisor.services.syncloop.syncpod import SyncDeps, deadline_left, sync_pod
from podvisor.services.syncloop.terminate import terminate_pod


def make_pod(containers: list[dict[str, Any]], **spec: Any) -> Pod:
    return pod_from_dict({"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
                          "spec": {"containers": containers, **spec}}).pod


class Harness:
    def __init__(self, tmp: Path) -> None:
        self.now = 100.0
        self.cri = FakeRuntimeClient(clock=lambda: int((1e9 + self.now) * 1e9))
        self.log = MemoryLogger()
        self.slept: list[float] = []
        self.deps = SyncDeps(
            cri=self.cri, pods_dir=tmp / "pods", pod_logs_dir=tmp / "pod-logs",
            backoff=SharedBackoff(CrashBackoff(BackoffPolicy(10, 300, 600))),
            image_backoff=SharedBackoff(CrashBackoff(BackoffPolicy(10, 300, 600))),
            mono=lambda: self.now, wall=lambda: 1e9 + self.now, log=self.log,
            sleep=self.slept.append)

    def events(self) -> list[tuple[str, str, str]]:
        return [e for rec in self.log.events for e in events_for(rec["event"], rec)]

    def running(self) -> dict[str, str]:
        return {s.metadata.name: cid for cid, (_sb, s) in self.cri.containers.items()
                if s.state == pb.CONTAINER_RUNNING}

    def config(self, name: str) -> pb.ContainerConfig:
        return next(args[1] for method, args in self.cri.calls
                    if method == "CreateContainer" and args[1].metadata.name == name)


def test_post_start_runs_after_the_start_and_its_failure_kills_the_container(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    ok = make_pod([{"name": "app", "image": "host", "command": ["sleep", "9"], "lifecycle": {
        "postStart": {"exec": {"command": ["touch", "/ready"]}}}}])
    assert sync_pod(h.deps, ok).ok
    [(_method, args)] = [c for c in h.cri.calls if c[0] == "ExecSync"]
    assert list(args[1]) == ["touch", "/ready"] and args[0] == h.running()["app"]
    order = [m for m, _ in h.cri.calls if m in ("StartContainer", "ExecSync")]
    assert order == ["StartContainer", "ExecSync"]  # after the start, as the kubelet

    h2 = Harness(tmp_path / "2")
    bad = make_pod([{"name": "app", "image": "host", "command": ["sleep", "9"], "lifecycle": {
        "postStart": {"exec": {"command": ["false"]}}}}])

    real = h2.cri.exec_sync

    def failing(cid: str, cmd: Any, timeout: float) -> pb.ExecSyncResponse:
        real(cid, cmd, timeout)
        return pb.ExecSyncResponse(exit_code=1, stderr=b"nope")

    h2.cri.exec_sync = failing  # type: ignore[method-assign]
    r = sync_pod(h2.deps, bad)
    assert not r.ok and r.waiting["app"].reason == "PostStartHookError"
    assert r.waiting["app"].message.startswith(
        'Exec lifecycle hook ([false]) for Container "app" in Pod "p_default(u1)" failed - '
        "error: command 'false' exited with 1: nope")
    assert h2.running() == {}  # killed
    assert ("Warning", "FailedPostStartHook", "PostStartHook failed") in h2.events()
    # the next sync restarts it (restartPolicy Always), after the crash back-off
    h2.now += 11
    again = sync_pod(h2.deps, bad)
    assert [c for c in h2.cri.calls if c[0] == "CreateContainer"][-1][1][1].metadata.attempt == 1
    assert again.waiting["app"].reason == "PostStartHookError"


def test_termination_log_file_mounted_on_the_message_path(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    pod = make_pod([{"name": "app", "image": "host", "command": ["sleep", "9"],
                     "terminationMessagePath": "/tmp/why",
                     "terminationMessagePolicy": "FallbackToLogsOnError"}])
    assert sync_pod(h.deps, pod).ok
    cfg = h.config("app")
    [mount] = [m for m in cfg.mounts if m.container_path == "/tmp/why"]
    host = Path(mount.host_path)
    assert host.parent == tmp_path / "pods" / "u1" / "containers" / "app"
    assert host.is_file() and host.stat().st_mode & 0o777 == 0o666 and not mount.readonly
    assert cfg.annotations[L.TERMINATION_MESSAGE_PATH] == "/tmp/why"
    assert cfg.annotations[L.TERMINATION_MESSAGE_POLICY] == "FallbackToLogsOnError"


def test_ephemeral_container_joins_its_target_and_leaves_the_app_alone(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    app = [{"name": "app", "image": "host", "command": ["sleep", "9"]}]
    assert sync_pod(h.deps, make_pod(app)).ok
    before = h.running()["app"]
    debug = make_pod(app, ephemeralContainers=[{"name": "dbg", "image": "host",
                                                "command": ["sh"], "targetContainerName": "app"}])
    r = sync_pod(h.deps, debug)
    assert r.ok and h.running() == {"app": before, "dbg": h.running()["dbg"]}
    ns = h.config("dbg").linux.security_context.namespace_options
    assert (ns.pid, ns.target_id) == (pb.TARGET, before)
    assert not [c for c in h.cri.calls if c[0] == "StopContainer"]
    h.cri.exit_container(h.running()["dbg"], 0)
    assert sync_pod(h.deps, debug).ok
    assert list(h.running()) == ["app"]  # an ephemeral container is never restarted


def test_active_deadline_kills_the_pod_and_nothing_restarts(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    pod = make_pod([{"name": "app", "image": "host", "command": ["sleep", "9"]}],
                   activeDeadlineSeconds=30)
    first = sync_pod(h.deps, pod, active_since=h.now)
    assert first.ok and not first.deadline_exceeded
    assert first.retry_after is not None and first.retry_after <= 30  # a sync at the deadline
    h.now += 31
    r = sync_pod(h.deps, pod, active_since=h.now)  # a restarted sync loop: the sandbox's age
    assert r.deadline_exceeded and h.running() == {}
    sandboxes = list(h.cri.sandboxes.values())
    assert [s.state for s in sandboxes] == [pb.SANDBOX_NOTREADY]
    again = sync_pod(h.deps, pod, active_since=h.now)
    assert again.deadline_exceeded and h.running() == {}
    assert len([c for c in h.cri.calls if c[0] == "RunPodSandbox"]) == 1
    rt = read_pod_runtime(h.cri, "u1", h.deps.mono, h.deps.wall)
    left = deadline_left(pod, rt, h.now, h.now, 1e9 + h.now)
    assert left is not None and left <= -1


def test_teardown_stops_sidecars_after_the_app_in_reverse_order(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    pod = make_pod([{"name": "app", "image": "host", "command": ["sleep", "9"]}],
                   initContainers=[
                       {"name": "s1", "image": "host", "restartPolicy": "Always",
                        "command": ["sleep", "9"]},
                       {"name": "s2", "image": "host", "restartPolicy": "Always",
                        "command": ["sleep", "9"]}])
    for _ in range(3):
        sync_pod(h.deps, pod)
    assert set(h.running()) == {"s1", "s2", "app"}
    names = {cid: name for name, cid in h.running().items()}
    order: list[str] = []
    lock = threading.Lock()
    real = h.cri.stop_container

    def stop(cid: str, timeout: int) -> None:
        with lock:
            order.append(names[cid])
        real(cid, timeout)

    h.cri.stop_container = stop  # type: ignore[method-assign]
    terminate_pod(h.cri, h.log, "u1", pod, 30, h.deps.sleep, h.deps.mono, h.deps.wall,
                  h.deps.pods_dir)
    assert order == ["app", "s2", "s1"]
