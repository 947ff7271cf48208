"""CRI contract: sandbox and container lifecycle, exit codes, stop escalation, idempotency.

Runs against every runtime (``cri_runtime``: embedded, containerd). Commands are ones busybox
has too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from tests.services.conftest import runs_processes

SLEEP = ["sleep", "1000"]


def test_version_and_status(cri_runtime: Any) -> None:
    version = cri_runtime.client.version()
    assert version.runtime_api_version == "v1"
    assert version.runtime_name
    conditions = {c.type: c.status for c in cri_runtime.client.status().status.conditions}
    assert conditions.get("RuntimeReady") is True


def test_sandbox_lifecycle(cri_runtime: Any) -> None:
    client = cri_runtime.client
    sid, _config = cri_runtime.run("lifecycle", labels={"app": "x"})
    status = client.pod_sandbox_status(sid)
    assert status.id == sid
    assert status.state == pb.SANDBOX_READY
    assert status.metadata.name == "lifecycle"
    assert status.labels["app"] == "x"
    assert status.created_at > 0
    assert sid in [s.id for s in client.list_pod_sandbox()]

    client.stop_pod_sandbox(sid)
    assert client.pod_sandbox_status(sid).state == pb.SANDBOX_NOTREADY
    client.stop_pod_sandbox(sid)  # idempotent
    client.remove_pod_sandbox(sid)
    assert sid not in [s.id for s in client.list_pod_sandbox()]
    client.remove_pod_sandbox(sid)  # idempotent


def test_container_lifecycle(cri_runtime: Any) -> None:
    client = cri_runtime.client
    sandbox = cri_runtime.run("ctr")
    sid, sconfig = sandbox
    cid = client.create_container(sid, cri_runtime.container_config("main", SLEEP), sconfig)
    status = client.container_status(cid)
    assert status.state == pb.CONTAINER_CREATED
    assert status.metadata.name == "main"
    assert status.created_at > 0

    client.start_container(cid)
    status = client.container_status(cid)
    assert status.state == pb.CONTAINER_RUNNING
    assert status.started_at >= status.created_at
    assert status.log_path.endswith("main/0.log")
    listed = client.list_containers(pb.ContainerFilter(pod_sandbox_id=sid))
    assert [(c.id, c.state) for c in listed] == [(cid, pb.CONTAINER_RUNNING)]

    client.stop_container(cid, 0)
    status = client.container_status(cid)
    assert status.state == pb.CONTAINER_EXITED
    assert status.finished_at >= status.started_at
    client.stop_container(cid, 0)  # idempotent
    client.remove_container(cid)
    assert client.list_containers(pb.ContainerFilter(pod_sandbox_id=sid)) == []
    client.remove_container(cid)  # idempotent


@pytest.mark.parametrize(("cmd", "code"), [(["true"], 0), (["false"], 1),
                                           (["sh", "-c", "exit 7"], 7)])
def test_exit_codes_of_finished_containers(cri_runtime: Any, cmd: list[str],
                                           code: int) -> None:
    cid = cri_runtime.start(cri_runtime.run("exit"), "job", cmd)
    status = cri_runtime.wait_exited(cid)
    assert status.exit_code == code
    assert status.reason == ("Completed" if code == 0 else "Error")
    assert status.finished_at > 0 and status.started_at > 0  # containerd may order them oddly


def test_exit_code_137_after_kill(cri_runtime: Any) -> None:
    cid = cri_runtime.start(cri_runtime.run("kill"), "sleeper", SLEEP)
    cri_runtime.client.stop_container(cid, 0)
    assert cri_runtime.client.container_status(cid).exit_code == 137


def _wait_ready(rt: Any, cid: str, poll: Any) -> None:
    """Wait until the container's script logged "ready" (its trap is installed)."""
    path = rt.client.container_status(cid).log_path
    poll(lambda: os.path.exists(path) and " ready" in Path(path).read_text(), message="ready")


def test_exit_code_143_after_term(cri_runtime: Any, poll: Any) -> None:
    runs_processes(cri_runtime, "signal traps")
    # A shell that exits on TERM the way an unhandled TERM reports (128 + 15). As PID 1 of a
    # container (containerd) a process without a handler would ignore TERM, so trap it.
    cmd = ["sh", "-c", "trap 'exit 143' TERM; echo ready; sleep 1000 & wait"]
    cid = cri_runtime.start(cri_runtime.run("term"), "termed", cmd)
    _wait_ready(cri_runtime, cid, poll)
    cri_runtime.client.stop_container(cid, 30)
    assert cri_runtime.client.container_status(cid).exit_code == 143


def test_stop_timeout_escalates_to_kill(cri_runtime: Any, poll: Any) -> None:
    runs_processes(cri_runtime, "signal traps")
    cmd = ["sh", "-c", "trap '' TERM; echo ready; while true; do sleep 1; done"]
    cid = cri_runtime.start(cri_runtime.run("stubborn"), "stubborn", cmd)
    _wait_ready(cri_runtime, cid, poll)
    cri_runtime.client.stop_container(cid, 1)
    status = cri_runtime.client.container_status(cid)
    assert status.state == pb.CONTAINER_EXITED
    assert status.exit_code == 137


def test_stop_sandbox_stops_its_containers(cri_runtime: Any) -> None:
    sandbox = cri_runtime.run("stopall")
    cids = [cri_runtime.start(sandbox, f"c{i}", SLEEP) for i in range(2)]
    cri_runtime.client.stop_pod_sandbox(sandbox[0])
    for cid in cids:
        assert cri_runtime.client.container_status(cid).state == pb.CONTAINER_EXITED


def test_remove_sandbox_removes_its_containers(cri_runtime: Any) -> None:
    sandbox = cri_runtime.run("rmall")
    cid = cri_runtime.start(sandbox, "c", SLEEP)
    cri_runtime.client.stop_pod_sandbox(sandbox[0])
    cri_runtime.client.remove_pod_sandbox(sandbox[0])
    assert cid not in [c.id for c in cri_runtime.client.list_containers()]


def test_restart_as_new_attempt(cri_runtime: Any) -> None:
    sandbox = cri_runtime.run("attempts")
    first = cri_runtime.start(sandbox, "app", ["false"])
    cri_runtime.wait_exited(first)
    second = cri_runtime.start(sandbox, "app", ["true"], attempt=1)
    assert second != first
    assert cri_runtime.wait_exited(second).metadata.attempt == 1


@pytest.mark.parametrize(("signal_name", "number", "code"), [
    ("SIGUSR1", "USR1", 41), ("SIGRTMINPLUS1", "35", 42), ("SIGRTMAXMINUS2", "62", 43)])
def test_stop_sends_the_configs_stop_signal(cri_runtime: Any, poll: Any, signal_name: str,
                                            number: str, code: int) -> None:
    """CRI's ``stop_signal`` (``lifecycle.stopSignal``) is what StopContainer sends, reported
    back in ContainerStatus; real-time signals count from SIGRTMIN / SIGRTMAX. containerd 1.6
    predates the field (it sends the image's stop signal, else SIGTERM)."""
    runs_processes(cri_runtime, "signal traps")
    if cri_runtime.name == "containerd":
        pytest.skip("containerd 1.6 ignores CRI's stop_signal (added to CRI in 1.33)")
    cmd = ["sh", "-c", f"trap 'exit {code}' {number}; trap '' TERM; echo ready; "
                       "while true; do sleep 0.1; done"]
    sandbox = cri_runtime.run(f"stopsig{code}")
    config = cri_runtime.container_config("stopsig", cmd)
    config.stop_signal = pb.Signal.Value(signal_name)
    cid = cri_runtime.client.create_container(sandbox[0], config, sandbox[1])
    cri_runtime.client.start_container(cid)
    _wait_ready(cri_runtime, cid, poll)
    cri_runtime.client.stop_container(cid, 30)
    status = cri_runtime.client.container_status(cid)
    assert (status.exit_code, status.stop_signal) == (code, pb.Signal.Value(signal_name))
