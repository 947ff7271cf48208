"""A container killed after a failed liveness or startup probe gets that probe's
``terminationGracePeriodSeconds`` (the kubelet's ``setTerminationGracePeriod``); any other kill
gets the pod's. SyncPod against the fake CRI (unit test: the grace is what StopContainer is
asked for)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from podvisor.common.logs import MemoryLogger
from podvisor.services.cri.fake import FakeRuntimeClient
from podvisor.services.pod import Pod, pod_from_dict
from podvisor.services.syncloop.backoff import BackoffPolicy, CrashBackoff, SharedBackoff
from podvisor.services.syncloop.syncpod import SyncDeps, sync_pod

PROBE = {"exec": {"command": ["true"]}}


def make_pod(policy: str = "Always") -> Pod:
    containers: list[dict[str, Any]] = [
        {"name": "live", "image": "host", "command": ["sleep", "1000"],
         "livenessProbe": {**PROBE, "terminationGracePeriodSeconds": 7}},
        {"name": "boot", "image": "host", "command": ["sleep", "1000"],
         "startupProbe": {**PROBE, "terminationGracePeriodSeconds": 4},
         "livenessProbe": PROBE},
        {"name": "plain", "image": "host", "command": ["sleep", "1000"],
         "livenessProbe": PROBE},
    ]
    return pod_from_dict({"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
                          "spec": {"containers": containers, "restartPolicy": policy,
                                   "terminationGracePeriodSeconds": 30}}).pod


def deps(tmp: Path) -> tuple[SyncDeps, FakeRuntimeClient]:
    now = [100.0]
    cri = FakeRuntimeClient(clock=lambda: int((1e9 + now[0]) * 1e9))
    return SyncDeps(
        cri=cri, pods_dir=tmp / "pods",
        pod_logs_dir=tmp / "logs", backoff=SharedBackoff(CrashBackoff(BackoffPolicy(1, 4, 600))),
        image_backoff=SharedBackoff(CrashBackoff(BackoffPolicy(1, 4, 600))),
        mono=lambda: now[0], wall=lambda: 1e9 + now[0], log=MemoryLogger(),
        sleep=lambda _s: None), cri


def running_ids(cri: FakeRuntimeClient) -> dict[str, str]:
    return {c.metadata.name: c.id for c in cri.list_containers() if c.state == 1}


@pytest.mark.parametrize("policy", ["Always", "Never"])
def test_a_failed_probe_kills_with_the_probes_grace(tmp_path: Path, policy: str) -> None:
    (d, cri), pod = deps(tmp_path), make_pod(policy)
    assert sync_pod(d, pod).ok
    ids = running_ids(cri)
    assert set(ids) == {"live", "boot", "plain"}
    failed = {ids["live"]: "liveness", ids["boot"]: "startup", ids["plain"]: "liveness"}
    assert sync_pod(d, pod, failed).ok
    assert sorted(cri.method_calls("StopContainer")) == sorted(
        [(ids["live"], 7), (ids["boot"], 4), (ids["plain"], 30)])


def test_a_liveness_failure_does_not_take_the_startup_probes_grace(tmp_path: Path) -> None:
    (d, cri), pod = deps(tmp_path), make_pod()
    assert sync_pod(d, pod).ok
    boot = running_ids(cri)["boot"]
    assert sync_pod(d, pod, {boot: "liveness"}).ok  # its liveness probe sets no grace
    assert cri.method_calls("StopContainer") == [(boot, 30)]
