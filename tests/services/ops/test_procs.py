"""``pod_procs``: a container's supervisord view from the three maps (pure; no agent)."""

from __future__ import annotations

import json
from pathlib import Path

from podvisor.ipc.control import ProcessRow, ProcessState
from podvisor.ipc.maps import DesiredPod
from podvisor.services.ops.procs import Proc, pod_procs
from tests.support.mapvalues import pod_wire, status_value
from tests.support.plegs import pleg_pod

POD = pod_wire({"metadata": {"name": "web", "namespace": "default", "uid": "u1"},
                "spec": {"containers": [{"name": "app", "image": "host"}]}})


def _procs(tmp_path: Path, status: dict[str, object] | None, runtime_state: str) -> list[Proc]:
    (tmp_path / "containers").mkdir(exist_ok=True)
    (tmp_path / "containers" / "c1.started.json").write_text(json.dumps({"pid": 4242}))
    statuses = {} if status is None else {"u1": status_value(
        {"containerStatuses": [{"name": "app", "containerID": "embedded://c1", **status}]})}
    pleg = {"u1": pleg_pod(containers=[{"id": "c1", "name": "app", "state": runtime_state,
                                        "created_at": 1, "started_at": 2}])}
    return pod_procs({"u1": DesiredPod(pod=POD)}, statuses, pleg, tmp_path)


def test_a_container_has_its_pid_while_the_runtime_runs_it(tmp_path: Path) -> None:
    """supervisord gives a pid while a process lives: a container the runtime already runs
    has its pid before the status says Running (STARTING), and none once it exited."""
    (starting,) = _procs(tmp_path, None, "CONTAINER_RUNNING")
    assert starting.state is ProcessState.STARTING and starting.pid == 4242
    (running,) = _procs(tmp_path, {"state": {"running": {}}}, "CONTAINER_RUNNING")
    assert running.state is ProcessState.RUNNING and running.pid == 4242
    (exited,) = _procs(tmp_path, {"state": {"running": {}}}, "CONTAINER_EXITED")
    assert exited.pid == 0
    (created,) = _procs(tmp_path, None, "CONTAINER_CREATED")
    assert created.state is ProcessState.STARTING and created.pid == 0
    # the status says running before PLEG's record reached this process: its pid all the same
    statuses = {"u1": status_value({"containerStatuses": [
        {"name": "app", "containerID": "embedded://c1", "state": {"running": {}}}]})}
    (early,) = pod_procs({"u1": DesiredPod(pod=POD)}, statuses, {}, tmp_path)
    assert early.state is ProcessState.RUNNING and early.pid == 4242


def test_a_restart_keeps_the_old_containers_exit_code(tmp_path: Path) -> None:
    """PLEG saw the container exit (137) and its successor created while the status still says
    running: the process is no longer RUNNING, and the old container's code is at hand for the
    restart's EXITED event."""
    (exited,) = _procs(tmp_path, {"state": {"running": {}}}, "CONTAINER_EXITED")
    assert exited.state is ProcessState.EXITED
    statuses = {"u1": status_value({"containerStatuses": [
        {"name": "app", "containerID": "embedded://c1", "state": {"running": {}}}]})}
    pleg = {"u1": pleg_pod(containers=[
        {"id": "c1", "name": "app", "state": "CONTAINER_EXITED", "exit_code": 137,
         "created_at": 1, "started_at": 2},
        {"id": "c2", "name": "app", "state": "CONTAINER_CREATED", "attempt": 1,
         "created_at": 3}])}
    (proc,) = pod_procs({"u1": DesiredPod(pod=POD)}, statuses, pleg, tmp_path)
    assert proc.state is ProcessState.STARTING and proc.extra["container_id"] == "c2"
    assert proc.exits == {"c1": 137}


def test_an_agent_rows_heartbeat_on_the_dashboard(tmp_path: Path) -> None:
    """``ok`` while beats come in time, the wall time of the last beat while late (the page
    ticks the age from it: an unchanged row stays unchanged), nothing unless RUNNING."""
    from podvisor.services.ops.dashboard import _proc_json
    from podvisor.services.ops.procs import agent_procs

    rows = [{"name": "a", "state": "RUNNING", "pid": 1, "uptime": 5.0, "heartbeatAge": 0.4,
             "heartbeatLate": False},
            {"name": "b", "state": "RUNNING", "pid": 2, "uptime": 9.0, "heartbeatAge": 3.5,
             "heartbeatLate": True},
            {"name": "c", "state": "BACKOFF", "pid": None, "heartbeatAge": None}]
    a, b, c = (_proc_json(p, 1000.0)
               for p in agent_procs(map(ProcessRow.from_wire, rows), 1000.0, tmp_path))
    assert (a["heartbeat"], b["heartbeat"], c["heartbeat"]) == ("ok", 996.5, None)
