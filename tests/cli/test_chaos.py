"""`podvisor chaos` (issue 16), the CI run: 20 pods, 60 s of faults (kill -9 and SIGSTOP of
subsystems including the runtime, kill -9 of containers, SIGKILL of the supervisor and a
restart, a burst of pods with kill -9 of the runtime or the sync loop in its midst: issue 22;
bus, cri, resource, api and disk faults: issue 28), against a real private agent joined to the
stand-in API server; every invariant must be 0. And `--root-dir`: 15 s, 4 pods
against an agent the test fixture started (chaos must leave it running).

A fault-injection test, not a soak: it runs in the normal suite."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from podvisor.cli.chaos import FAULTS, INVARIANTS, Report
from tests.conftest import short_tmp_dir
from tests.support.kubeapi import KubeApi

BIN = Path(sys.executable).parent


@pytest.mark.timeout(600)  # 60 s of faults, then convergence and shutdown, on a loaded machine
def test_chaos_20_pods_60_seconds_every_invariant_zero(tmp_path: Path) -> None:
    """Every kind: the api faults need an API server, the stand-in one (``--kubeconfig``)."""
    api = KubeApi(tmp_path / "kubeapi")
    api.start()
    try:
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", user="system:node:chaos",
                                    groups=("system:nodes",))
        run = subprocess.run([str(BIN / "podvisor"), "chaos", "--pods", "20", "--duration",
                              "60", "--seed", "16", "--json", "--kubeconfig", str(kubeconfig)],
                             capture_output=True, text=True, timeout=600, check=False)
    finally:
        api.stop()
    report = json.loads(run.stdout)
    assert report["error"] == "", report
    assert report["invariants"] == dict.fromkeys(INVARIANTS, 0), report["details"]
    assert run.returncode == 0, run.stderr[-2000:]
    assert report["ok"] is True
    # every kind of fault happened, and each recovered
    assert set(report["faults"]) == {k for k, _ in FAULTS} == {
        "kill", "stop", "container", "supervisor", "burst-kill", "bus", "cri", "resource",
        "api", "disk"}, report
    assert report["recovery"]["container"]["n"] == report["faults"]["container"]
    assert report["recovery"]["supervisor"]["n"] == report["faults"]["supervisor"]
    assert sum(v["n"] for k, v in report["recovery"].items() if k.startswith("burst-kill")) \
        == report["faults"]["burst-kill"]


def test_report_fails_on_any_invariant_and_prints_it() -> None:
    report = Report(seed=1, pods=2, duration=1.0)
    assert report.ok
    report.invariants["restarts_missed"] = 1
    report.details.append("chaos0: 0 restarts, 1 kills")
    assert not report.ok
    assert report.to_json()["ok"] is False
    text = report.text()
    assert "FAILED" in text and "restarts_missed            1" in text


@pytest.mark.parametrize("args, says", [
    (["--pods", "0"], "--pods must be >= 1"),
    (["--faults", "kill,flood"], "unknown fault kind(s) flood (known: kill, stop,"),
    (["--burst", "0"], "--burst must be >= 1"),
])
def test_chaos_refuses_bad_arguments(args: list[str], says: str) -> None:
    run = subprocess.run([str(BIN / "podvisor"), "chaos", *args], capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 2
    assert says in run.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.timeout(300)
def test_chaos_root_dir_attaches_to_a_running_agent_and_leaves_it_running(
        agent: Any, wait_for: Any) -> None:
    """`podvisor chaos --root-dir DIR` against an agent it did not start: its pods go to that
    agent's staticPodPath and leave it after; subsystem and container faults, no supervisor
    SIGKILL (a note says so); every invariant 0; the agent still runs, its own pod untouched."""
    manifests = short_tmp_dir("pvchm")
    try:
        port = _free_port()
        handle = agent(config={
            "nodeName": "attached", "staticPodPath": str(manifests),
            "fileCheckFrequency": "1s", "readOnlyPort": port, "stopPodsOnExit": True,
            "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s",
                            "defaults": {"heartbeatTimeout": "3s"}}})
        (manifests / "mine.yaml").write_text(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: mine\nspec:\n  containers:\n"
            "  - name: app\n    image: host\n    command: [\"sleep\", \"1000000\"]\n",
            encoding="utf-8")
        started_at = handle.call("status")["agent"]["startedAt"]
        run = subprocess.run([str(BIN / "podvisor"), "chaos", "--root-dir", str(handle.paths.root),
                              "--pods", "4", "--duration", "15", "--seed", "5", "--json"],
                             capture_output=True, text=True, timeout=280, check=False)
        report = json.loads(run.stdout)
        assert report["error"] == "", report
        assert report["invariants"] == dict.fromkeys(INVARIANTS, 0), report["details"]
        assert run.returncode == 0, run.stderr[-2000:]
        assert "supervisor" not in report["faults"]
        assert report["faults"], report  # some fault happened in 15 s
        assert any("supervisor SIGKILL + restart fault is skipped" in n for n in report["notes"])
        # the agent is the same process, still up; chaos's manifests are gone, the user's stays
        assert handle.proc.poll() is None
        assert sorted(p.name for p in manifests.iterdir()) == ["mine.yaml"]
        assert handle.call("status")["agent"]["startedAt"] == started_at

        def only_mine_running() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/pods", timeout=5) as resp:
                items = json.load(resp)["items"]
            return [p["metadata"]["name"] for p in items] == ["mine-attached"] and all(
                "running" in c["state"] for c in items[0]["status"]["containerStatuses"])
        wait_for(only_mine_running, 30.0)
    finally:
        shutil.rmtree(manifests, ignore_errors=True)


def test_chaos_root_dir_without_an_agent_says_so(tmp_path: Path) -> None:
    run = subprocess.run([str(BIN / "podvisor"), "chaos", "--root-dir", str(tmp_path),
                          "--pods", "1", "--duration", "0", "--json"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 1
    report = json.loads(run.stdout)
    assert "no agent's run/config.json under" in report["error"]
    assert list(tmp_path.iterdir()) == []  # nothing written there
