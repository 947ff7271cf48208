"""PyPI's supervisorctl (its own virtualenv) drives a real agent over the ops port."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ops.opsagent import APP, OpsAgent, ops_agent
from tests.ops.peers import peer_bin

# One agent for the module (stopped by PID with its pods); restarts outlive single tests.
pytestmark = pytest.mark.no_leak_check


@pytest.fixture(scope="module")
def ops() -> Iterator[OpsAgent]:
    yield from ops_agent()


@pytest.fixture(scope="module")
def bindir() -> Path:
    return peer_bin()


def ctl(bindir: Path, ops: OpsAgent, *args: str,
        password: str | None = None) -> subprocess.CompletedProcess[str]:
    pw = ops.password if password is None else password
    return subprocess.run([str(bindir / "supervisorctl"), "-s", ops.url, "-u", "admin", "-p", pw,
                           *args], capture_output=True, text=True, timeout=120)


def test_status_lists_agent_and_containers(bindir: Path, ops: OpsAgent) -> None:
    out = ctl(bindir, ops, "status")
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    for name in ("agent:pleg", "agent:syncloop", "agent:ops", APP):
        assert name in lines, out.stdout + out.stderr
        assert "RUNNING" in lines[name] and "pid " in lines[name]


def test_restart_pleg_changes_pid(bindir: Path, ops: OpsAgent) -> None:
    before = ops.rpc().supervisor.getProcessInfo("agent:pleg")["pid"]
    out = ctl(bindir, ops, "restart", "agent:pleg")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "agent:pleg: stopped" in out.stdout and "agent:pleg: started" in out.stdout
    after = ops.rpc().supervisor.getProcessInfo("agent:pleg")
    assert after["statename"] == "RUNNING" and after["pid"] != before


def test_tail_syncloop(bindir: Path, ops: OpsAgent) -> None:
    out = ctl(bindir, ops, "tail", "agent:syncloop")
    assert out.returncode == 0, out.stderr
    assert '"syncloop"' in out.stdout


def test_stop_start_container(bindir: Path, ops: OpsAgent,
                              wait_for: Callable[..., Any]) -> None:
    out = ctl(bindir, ops, "stop", APP)
    assert f"{APP}: stopped" in out.stdout, out.stdout + out.stderr
    # restartPolicy Always: the kubelet restarts it; start waits for that (or finds it back)
    out = ctl(bindir, ops, "start", APP)
    assert (f"{APP}: started" in out.stdout
            or f"{APP}: ERROR (already started)" in out.stdout), out.stdout + out.stderr
    wait_for(lambda: "RUNNING" in ctl(bindir, ops, "status", APP).stdout, 60.0,
             message="container RUNNING again")


def test_wrong_password_refused(bindir: Path, ops: OpsAgent) -> None:
    out = ctl(bindir, ops, "status", password="wrong")
    assert out.returncode != 0
    assert "Server requires authentication" in out.stdout + out.stderr
