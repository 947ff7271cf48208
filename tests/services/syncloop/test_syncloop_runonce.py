"""RunOnce's logic (`services/syncloop/runonce.py`) over the CRI fake and a fake clock: the plan
(bad inputs, duplicates, admission), when a pod counts as started, and the retry loop (tries,
doubling waits, a runtime that is down for a while, a pod that never starts). The real agent
runs it in tests/services/syncloop/test_e2e_runonce.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from podvisor.common.logs import MemoryLogger
from podvisor.services.cri.errors import CriError
from podvisor.services.cri.fake import FakeRuntimeClient
from podvisor.services.pod import Pod, pod_from_dict
from podvisor.services.syncloop.backoff import BackoffPolicy, CrashBackoff, SharedBackoff
from podvisor.services.syncloop.runonce import (
    PodResult,
    RetryPolicy,
    plan,
    pod_started,
    run_pod,
    run_pods,
)
from podvisor.services.syncloop.runtime_state import read_pod_runtime
from podvisor.services.syncloop.syncpod import SyncDeps
from tests.services.syncloop.test_podworkers import published


def manifest(name: str, uid: str, image: str = "host", policy: str = "Always",
             host_port: int | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "c", "image": image, "command": ["sleep", "100"]}
    if host_port is not None:
        c["ports"] = [{"containerPort": host_port, "hostPort": host_port}]
    return published({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"restartPolicy": policy, "containers": [c]}})


def pod(*args: Any, **kw: Any) -> Pod:
    return pod_from_dict(manifest(*args, **kw)).pod


class KnowsOnlyHost(FakeRuntimeClient):
    """The fake, with the embedded runtime's one image: any other pull fails."""

    def pull_image(self, image: str, sandbox_config: Any = None, annotations: Any = None) -> str:
        if image != "host":
            self._enter("PullImage", image, sandbox_config, annotations)
            raise CriError("PullImage", grpc.StatusCode.NOT_FOUND, f"image {image!r} not found")
        return super().pull_image(image, sandbox_config, annotations)


class Harness:
    def __init__(self, tmp: Path) -> None:
        self.now = 100.0
        self.cri = KnowsOnlyHost(clock=lambda: int((1e9 + self.now) * 1e9))
        self.log = MemoryLogger()
        self.waits: list[float] = []
        self.deps = SyncDeps(
            cri=self.cri, pods_dir=tmp / "pods", pod_logs_dir=tmp / "pod-logs",
            backoff=SharedBackoff(CrashBackoff(BackoffPolicy(10, 300, 600))),
            image_backoff=SharedBackoff(CrashBackoff(BackoffPolicy(10, 300, 600))),
            mono=lambda: self.now, wall=lambda: 1e9 + self.now, log=self.log,
            sleep=lambda _s: None)

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return False


# --- plan ------------------------------------------------------------------------------------


def test_plan_reports_bad_inputs_duplicates_and_rejections_and_keeps_the_rest() -> None:
    sets = {
        "file": {"pods": [manifest("a", "ua", host_port=8080), manifest("a", "ua2"),
                          manifest("b", "ub", host_port=8080), manifest("c", "uc")],
                 "errors": [{"file": "/m/bad.yaml", "field": "spec", "reason": "is required"}]},
        "http": {"pods": [manifest("d", "ud")], "errors": []},
    }
    pods, known = plan(sets)
    assert [p.metadata.name for p in pods] == ["a", "c", "d"]
    by_pod = {r.pod: r for r in known}
    assert by_pod["/m/bad.yaml"].state == "invalid"
    assert by_pod["/m/bad.yaml"].message == "spec: is required"
    assert by_pod["default/b"].state == "rejected" and "HostPortConflict" in \
        by_pod["default/b"].message
    assert [r.state for r in known if r.uid == "ua2"] == ["rejected"]  # the duplicate name
    assert not any(r.ok for r in known)


def test_result_lines() -> None:
    assert PodResult("default/a", True, "running", tries=1).line() == \
        "pod default/a: running after 1 try"
    assert PodResult("default/b", False, "failed", "boom", 3).line() == \
        "pod default/b: failed after 3 tries: boom"
    assert PodResult("/m/x.yaml", False, "invalid", "bad").line() == "pod /m/x.yaml: invalid: bad"
    r = PodResult("default/a", True, "succeeded", "", 2, "u")
    assert PodResult.from_dict(r.to_dict()) == r


# --- started ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "exit_code", "expected"), [
    ("Never", 0, "succeeded"), ("OnFailure", 0, "succeeded"), ("Always", 0, None),
    ("Never", 1, None)])
def test_an_exited_container_counts_when_it_completed_for_good(
        tmp_path: Path, policy: str, exit_code: int, expected: str | None) -> None:
    h = Harness(tmp_path)
    p = pod("p", "u1", policy=policy)
    assert run_pod(h.deps, p, RetryPolicy(tries=1), h.wait).state == "running"
    [c] = h.cri.list_containers()
    h.cri.exit_container(c.id, exit_code)
    assert pod_started(p, read_pod_runtime(h.cri, "u1", h.deps.mono, h.deps.wall)) == expected


# --- the retry loop --------------------------------------------------------------------------


def test_a_pod_that_runs_at_once_takes_one_sync(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    r = run_pod(h.deps, pod("p", "u1"), RetryPolicy(), h.wait)
    assert (r.ok, r.state, r.tries, r.pod) == (True, "running", 1, "default/p")
    assert h.waits == [1.0]
    assert len(h.cri.method_calls("StartContainer")) == 1
    # already running: adopted, no sync at all
    again = run_pod(h.deps, pod("p", "u1"), RetryPolicy(), h.wait)
    assert (again.ok, again.tries) == (True, 0)
    assert len(h.cri.method_calls("StartContainer")) == 1


def test_a_runtime_down_for_a_while_costs_tries_not_the_run(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.cri.fail("ListPodSandbox", grpc.StatusCode.UNAVAILABLE, "connection refused", times=3)
    r = run_pod(h.deps, pod("p", "u1"), RetryPolicy(tries=10, delay=1.0), h.wait)
    assert r.ok and r.state == "running"
    assert h.waits[:2] == [1.0, 2.0]  # doubling
    assert h.log.named("syncloop.runonce.sync_failed")


def test_a_pod_that_never_starts_fails_after_its_tries_with_the_reason(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    r = run_pod(h.deps, pod("bad", "ub", image="nosuch:1"), RetryPolicy(tries=4, delay=0.5),
                h.wait)
    assert (r.ok, r.state, r.tries) == (False, "failed", 4)
    assert h.waits == [0.5, 1.0, 2.0, 4.0]
    assert r.message.startswith("containers not running after 4 tries (c: ErrImagePull: ")
    assert "nosuch:1" in r.message


def test_run_pods_runs_every_pod_and_one_failure_is_only_its_own(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    pods = [pod("a", "ua"), pod("bad", "ub", image="nosuch:1"), pod("c", "uc", policy="Never")]
    results = run_pods(h.deps, pods, RetryPolicy(tries=2, delay=0.01), lambda _s: False)
    assert [(r.pod, r.ok) for r in results] == [
        ("default/a", True), ("default/bad", False), ("default/c", True)]


def test_a_stop_interrupts_the_run(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    r = run_pod(h.deps, pod("bad", "ub", image="nosuch:1"), RetryPolicy(), lambda _s: True)
    assert (r.ok, r.message, r.tries) == (False, "interrupted", 1)
