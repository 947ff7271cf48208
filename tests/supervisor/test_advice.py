"""Every command the agent prints as advice works as printed.

The start-up lines (`podvisorctl --root-dir DIR status`, `... pods`, `curl -s URL/pods`) are
run here against a real agent with the built-ins; the stop command printed on exit and after
RunOnce is run by tests/supervisor/test_e2e_lifecycle_restart.py and
tests/services/syncloop/test_e2e_runonce.py.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from podvisor.common.config import config_from_mapping
from podvisor.supervisor import advice
from tests.support.lifecycle import agent_config, free_port, pod_yaml


def start_lines(output: str) -> list[str]:
    lines = output.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("podvisor: running on"))
    out = []
    for line in lines[head + 1:]:
        if not line.startswith("  "):
            break
        out.append(line.strip())
    return out


def run(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=60,
                          cwd="/")


@pytest.mark.timeout(120)
def test_the_start_advice_commands_work_as_printed(agent: Any, wait_for: Any) -> None:
    manifests = Path(tempfile.mkdtemp(prefix="pvadv", dir="/tmp"))
    (manifests / "p.yaml").write_text(pod_yaml("p", "exec sleep 3600"), "utf-8")
    port = free_port()
    try:
        check_start_advice(agent(config=agent_config(manifests, port, stopPodsOnExit=True)),
                           port, wait_for)
    finally:
        shutil.rmtree(manifests, ignore_errors=True)


def check_start_advice(handle: Any, port: int, wait_for: Any) -> None:
    commands = wait_for(lambda: "podvisor: running on" in handle.stderr()
                        and start_lines(handle.stderr()), 30.0, 0.05, "the start advice")
    root = str(handle.paths.root)
    assert [c.split()[-1] for c in commands] == ["status", "pods",
                                                 f"http://127.0.0.1:{port}/pods"]
    assert all(f"--root-dir {root}" in c for c in commands[:2])

    status = wait_for(lambda: (r := run(commands[0])).returncode == 0 and r, 30.0, 0.1)
    assert status.stdout.split()[0] == "NAME" and "syncloop" in status.stdout
    pods = wait_for(lambda: (r := run(commands[1])).returncode == 0 and "p-e2e" in r.stdout
                    and r, 60.0, 0.2, "`pods` to list the pod")
    assert "p-e2e" in pods.stdout

    def podlist() -> dict[str, Any] | None:
        r = run(commands[2])
        try:
            body: dict[str, Any] = json.loads(r.stdout)
        except ValueError:
            return None
        return body if r.returncode == 0 and body.get("kind") == "PodList" else None
    body = wait_for(podlist, 60.0, 0.2, "curl to print the PodList")
    assert [p["metadata"]["name"] for p in body["items"]] == ["p-e2e"]
    assert handle.stop() == 0


def test_ctl_program_is_what_a_shell_finds(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    venv = tmp_path / "my venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "podvisorctl").write_text("#!/bin/sh\n")
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    monkeypatch.setattr(advice.shutil, "which", lambda _name: None)  # the venv is not on PATH
    assert advice.ctl_program() == shlex.quote(str(venv / "podvisorctl"))
    monkeypatch.setattr(advice.shutil, "which", lambda _name: str(venv / "podvisorctl"))
    assert advice.ctl_program() == "podvisorctl"
    monkeypatch.setattr(advice.shutil, "which", lambda _name: "/usr/bin/podvisorctl")
    assert advice.ctl_program() == shlex.quote(str(venv / "podvisorctl"))  # not that other one
    (venv / "podvisorctl").unlink()
    monkeypatch.setattr(advice.shutil, "which", lambda _name: None)
    assert advice.ctl_program() == f"{shlex.quote(str(venv / 'python'))} -m " \
                                   "podvisor.cli.ctl"
    assert shlex.split(advice.stop_pods_command("/tmp/a b"))[-4:] == [
        "--root-dir", "/tmp/a b", "shutdown", "--pods"]


def test_start_advice_lines() -> None:
    cfg = config_from_mapping({"rootDir": "/r", "readOnlyPort": 10255, "address": "0.0.0.0"})
    lines = advice.start_advice(cfg, manages_pods=True)
    assert lines[-1] == "  curl -s http://127.0.0.1:10255/pods"
    assert re.search(r"--root-dir /r pods$", lines[-2])
    off = config_from_mapping({"rootDir": "/r", "readOnlyPort": 0})
    assert len(advice.start_advice(off, manages_pods=True)) == 3  # no curl without the port
    assert len(advice.start_advice(off, manages_pods=False)) == 2  # only status
    assert "pods keep running" in advice.start_advice(off, manages_pods=True)[0]


def test_start_advice_with_graceful_node_shutdown() -> None:
    """The `shutdown --node` line (run as printed by test_e2e_node_shutdown.py), and what
    Ctrl-C does under shutdownOnSignal."""
    cfg = config_from_mapping({"rootDir": "/r", "shutdownGracePeriod": "30s"})
    lines = advice.start_advice(cfg, manages_pods=True)
    assert re.search(r"--root-dir /r shutdown --node$", lines[-1])
    assert "pods keep running" in lines[0]
    on_signal = config_from_mapping({"rootDir": "/r", "shutdownGracePeriod": "30s",
                                     "shutdownOnSignal": True})
    assert "Ctrl-C drains the node" in advice.start_advice(on_signal, manages_pods=True)[0]
