"""`podvisor chaos` (issue 16), the CI run: 20 pods, 60 s of faults (kill -9 and SIGSTOP of
subsystems including the runtime, kill -9 of containers, SIGKILL of the supervisor and a
restart), against a real private agent; every invariant must be 0.

A fault-injection test, not a soak: it runs in the normal suite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from podvisor.supervisor.chaos import INVARIANTS, Report

BIN = Path(sys.executable).parent


@pytest.mark.timeout(600)  # 60 s of faults, then convergence and shutdown, on a loaded machine
def test_chaos_20_pods_60_seconds_every_invariant_zero() -> None:
    run = subprocess.run([str(BIN / "podvisor"), "chaos", "--pods", "20", "--duration", "60",
                          "--seed", "16", "--json"], capture_output=True, text=True,
                         timeout=600, check=False)
    report = json.loads(run.stdout)
    assert report["error"] == "", report
    assert report["invariants"] == dict.fromkeys(INVARIANTS, 0), report["details"]
    assert run.returncode == 0, run.stderr[-2000:]
    assert report["ok"] is True
    # every kind of fault happened, and each recovered
    assert set(report["faults"]) == {"kill", "stop", "container", "supervisor"}, report
    assert report["recovery"]["container"]["n"] == report["faults"]["container"]
    assert report["recovery"]["supervisor"]["n"] == report["faults"]["supervisor"]


def test_report_fails_on_any_invariant_and_prints_it() -> None:
    report = Report(seed=1, pods=2, duration=1.0)
    assert report.ok
    report.invariants["restarts_missed"] = 1
    report.details.append("chaos0: 0 restarts, 1 kills")
    assert not report.ok
    assert report.to_json()["ok"] is False
    text = report.text()
    assert "FAILED" in text and "restarts_missed            1" in text


def test_chaos_refuses_bad_arguments() -> None:
    run = subprocess.run([str(BIN / "podvisor"), "chaos", "--pods", "0"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 2
    assert "--pods must be >= 1" in run.stderr
