"""Pod networks in the sync loop, over the CRI fake's containerd-without-CNI knob
(``FakeRuntimeClient.set_network``): NetworkReady=false holds pods that are not hostNetwork and
is said once; a sandbox whose network setup failed (its name stays reserved, its stop fails)
never blocks the pod: the next attempt is the largest listed + 1 and the dead sandbox is
stopped and removed with back-off once the network works."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from cri_api.v1 import api_pb2 as pb

from podvisor.common.logs import MemoryLogger
from podvisor.ipc.maps import RUNTIME_KEY, RuntimeNetwork
from podvisor.services.cri.fake import FakeRuntimeClient
from podvisor.services.pod import pod_from_dict
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.actions import compute_pod_actions
from podvisor.services.syncloop.backoff import BackoffPolicy, CrashBackoff, SharedBackoff
from podvisor.services.syncloop.loop import LoopDeps, SyncLoop
from podvisor.services.syncloop.network import NetworkState
from podvisor.services.syncloop.podconfig import new_pod_config
from podvisor.services.syncloop.runtime_state import PodRuntime, SandboxInfo
from podvisor.services.syncloop.syncpod import SyncDeps
from podvisor.services.syncloop.workers import Timing, WorkerTable
from tests.services.syncloop.test_podworkers import published

ERROR_DELAY = 10.0


def manifest(name: str, uid: str, host_network: bool = False) -> dict[str, Any]:
    return published({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"hostNetwork": host_network, "terminationGracePeriodSeconds": 2,
                     "containers": [{"name": "c", "image": "host", "command": ["sleep", "9"]}]}})


class Desired:
    def __init__(self) -> None:
        self.items: dict[str, Any] = {}

    def set(self, key: str, value: Any) -> bool:
        self.items[key] = value
        return True

    def delete(self, key: str) -> bool:
        return self.items.pop(key, None) is not None


class Harness:
    def __init__(self, tmp: Path, gate: bool = True) -> None:
        self.now = 100.0
        self.cri = FakeRuntimeClient(clock=lambda: int((1e9 + self.now) * 1e9))
        self.log = MemoryLogger()
        self.desired = Desired()
        self.sync = SyncDeps(
            cri=self.cri, pods_dir=tmp / "pods", pod_logs_dir=tmp / "pod-logs",
            backoff=SharedBackoff(CrashBackoff(BackoffPolicy(1, 4, 600))),
            image_backoff=SharedBackoff(CrashBackoff(BackoffPolicy(1, 4, 600))),
            mono=lambda: self.now, wall=lambda: 1e9 + self.now, log=self.log,
            sleep=lambda _s: None, network=NetworkState() if gate else None)

        def run_inline(fn: Callable[[], None]) -> None:
            fn()

        self.loop = SyncLoop(LoopDeps(
            sync=self.sync, pod_config=new_pod_config(("file",)),
            table=WorkerTable(Timing(error_delay=ERROR_DELAY), rand=lambda: 0.0),
            desired=self.desired, submit=run_inline, wake=lambda: None, node_name="n1"))

    def run_for(self, seconds: float, step: float = 0.5) -> None:
        """Advance the fake clock, stepping the loop as its thread would."""
        end = self.now + seconds
        while self.now < end:
            self.loop.step(self.now)
            self.now += step
        self.loop.step(self.now)

    def running(self, uid: str) -> list[str]:
        return [c.labels[L.CONTAINER_NAME] for c in self.cri.list_containers()
                if c.state == pb.CONTAINER_RUNNING and c.labels[L.POD_UID] == uid]

    def sandboxes(self, uid: str) -> list[pb.PodSandbox]:
        return [s for s in self.cri.list_pod_sandbox() if s.labels[L.POD_UID] == uid]

    def errors(self) -> list[str]:
        return [str(e.get("error", "")) for e in self.log.named("syncloop.work.failed")]


def test_network_not_ready_holds_only_pods_without_host_network_and_says_so_once(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.cri.set_network(False)
    h.loop.handle_pod_set("file", [manifest("own", "u-own"), manifest("host", "u-host", True)],
                          h.now)
    h.run_for(65.0)  # several error delays and housekeepings
    assert h.running("u-host") == ["c"]
    assert h.running("u-own") == [] and h.sandboxes("u-own") == []  # never even tried
    [sandbox_call] = h.cri.method_calls("RunPodSandbox")
    assert sandbox_call[0].metadata.uid == "u-host"
    [node] = h.log.named("syncloop.runtime.network_not_ready")
    assert node["node"] == "n1" and node["reason"] == "NetworkPluginNotReady"
    assert node["message"] == ("container runtime network not ready: NetworkReady=false "
                               "reason:NetworkPluginNotReady message:Network plugin returns "
                               "error: cni plugin not initialized")
    [held] = h.log.named("syncloop.pod.network_not_ready")  # once, whatever the retries
    assert held["pod_uid"] == "u-own"
    assert held["message"] == "network is not ready: " + node["message"]
    assert h.desired.items[RUNTIME_KEY].ready is False
    assert "network is not ready" in h.desired.items["u-own"].message
    assert h.errors() == []  # held is no failed sync: no FailedSync event per retry
    # held syncs cost no CRI call: only housekeeping's Status (every 2 s) and listings
    assert len(h.cri.method_calls("Status")) <= 65.0 / 2 + 3

    h.cri.set_network(True)
    h.run_for(3.0)  # the next housekeeping sees it: the held pod syncs at once
    assert h.running("u-own") == ["c"]
    [ready] = h.log.named("syncloop.runtime.network_ready")
    assert ready["held"] == 1
    assert h.desired.items[RUNTIME_KEY] == RuntimeNetwork(
        True, "", "", "container runtime network is ready")
    [sandbox] = h.sandboxes("u-own")
    assert h.cri.pod_sandbox_status(sandbox.id).network.ip.startswith("10.88.")
    [created] = [e for e in h.log.named("syncloop.sandbox.created") if e["pod_uid"] == "u-own"]
    assert created["pod_ips"] == [h.cri.pod_sandbox_status(sandbox.id).network.ip]


def test_a_sandbox_whose_network_failed_never_blocks_the_pod(tmp_path: Path) -> None:
    """Without the network gate (a runtime that says NetworkReady but fails the setup, or the
    first sync racing the first Status), containerd's failure mode: the failed sandbox keeps
    its name (name, uid, namespace, attempt) and cannot be stopped. The next attempt is the
    largest listed + 1, never a reserved name; the dead sandboxes are stopped and removed, with
    back-off, once they can be."""
    h = Harness(tmp_path, gate=False)
    h.cri.set_network(False)
    h.loop.handle_pod_set("file", [manifest("own", "u-own")], h.now)
    h.run_for(35.0)
    attempts = sorted(s.metadata.attempt for s in h.sandboxes("u-own"))
    assert len(attempts) >= 3 and attempts == list(range(len(attempts)))
    assert not any("is reserved" in e for e in h.errors()), h.errors()
    assert all("cni plugin not initialized" in e for e in h.errors())
    stop_failed = h.log.named("syncloop.sandbox.stop_failed")
    assert stop_failed and all(e["pod_uid"] == "u-own" for e in stop_failed)
    # back-off per sandbox: 2 s doubling, so far fewer stops than syncs x sandboxes
    per_sandbox: dict[str, int] = {}
    for (sid,) in h.cri.method_calls("StopPodSandbox"):
        per_sandbox[sid] = per_sandbox.get(sid, 0) + 1
    assert max(per_sandbox.values()) <= 4, per_sandbox

    h.cri.set_network(True)
    h.run_for(320.0)  # the longest back-off so far ends; the error retry creates the sandbox
    assert h.running("u-own") == ["c"]
    [left] = h.sandboxes("u-own")  # every dead one stopped and removed
    assert left.state == pb.SANDBOX_READY and left.metadata.attempt == len(attempts)
    assert h.log.named("syncloop.sandbox.removed")


def test_next_attempt_is_the_largest_listed_plus_one() -> None:
    """containerd lists sandboxes whose setup failed with no creation time, so the newest by
    time is not the one with the largest attempt (the old rule gave a reserved name)."""
    p = pod_from_dict(manifest("own", "u1")).pod
    rt = PodRuntime(sandboxes=(SandboxInfo("s0", False, 0, 0), SandboxInfo("s2", False, 2, 0),
                               SandboxInfo("s1", False, 1, 0)))

    class NoBackoff:
        def remaining(self, key: Any, finished_at: float, now: float) -> float:
            return 0.0

    actions = compute_pod_actions(p, rt, 0.0, NoBackoff())
    assert actions.create_sandbox and actions.attempt == 3
    assert actions.remove_sandboxes == ("s0", "s2", "s1")
    waiting = compute_pod_actions(p, rt, 0.0, NoBackoff(),
                                  sandbox_wait=lambda sid: 5.0 if sid == "s2" else 0.0)
    assert waiting.remove_sandboxes == ("s0", "s1") and waiting.retry_after == 5.0


def test_a_pod_deleted_while_its_sandboxes_cannot_stop_terminates_once_they_can(
        tmp_path: Path) -> None:
    h = Harness(tmp_path, gate=False)
    h.cri.set_network(False)
    h.loop.handle_pod_set("file", [manifest("own", "u-own")], h.now)
    h.run_for(12.0)
    assert len(h.sandboxes("u-own")) == 2  # two failed setups, both unstoppable
    h.loop.handle_pod_set("file", [], h.now)
    h.run_for(30.0)
    assert h.loop.deps.table.get("u-own") is not None  # still terminating, retried
    failed = [e for e in h.log.named("syncloop.work.failed") if e["kind"] == "terminate"]
    assert 2 <= len(failed) <= 4  # at the error delay (10 s), not in a tight loop
    # every sandbox was tried on each attempt, not only the first
    stops = [sid for (sid,) in h.cri.method_calls("StopPodSandbox")]
    assert {s.id for s in h.sandboxes("u-own")} <= set(stops[-2:])
    h.cri.set_network(True)
    h.run_for(12.0)
    assert h.loop.deps.table.get("u-own") is None and h.sandboxes("u-own") == []
    assert "u-own" not in h.desired.items
