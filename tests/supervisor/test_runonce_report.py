"""How the supervisor turns RunOnce's `run/runonce.json` into output and an exit code."""

from __future__ import annotations

import json
from pathlib import Path

from podvisor.supervisor.runonce import INTERRUPTED, driver_failed, read_report

HINT = "stop them with `podvisorctl --root-dir /r shutdown --pods`"


def write(path: Path, *rows: tuple[str, bool]) -> Path:
    path.write_text(json.dumps({"results": [
        {"pod": pod, "ok": ok, "state": "running" if ok else "failed",
         "line": f"pod {pod}: {'running' if ok else 'failed'}"} for pod, ok in rows]}))
    return path


def test_all_started(tmp_path: Path) -> None:
    r = read_report(write(tmp_path / "r.json", ("default/a", True), ("default/b", True)), HINT)
    assert r.exit_code == 0
    assert r.lines == ("pod default/a: running", "pod default/b: running")
    assert r.summary == f"podvisor: runonce: 2 pods started; 2 pods left running: {HINT}"


def test_failed_pods_are_named(tmp_path: Path) -> None:
    r = read_report(write(tmp_path / "r.json", ("default/a", True), ("default/b", False),
                          ("/m/x.yaml", False)), HINT)
    assert r.exit_code == 1 and len(r.lines) == 3
    assert r.summary == ("podvisor: runonce: 2 of 3 pods failed: default/b, /m/x.yaml; "
                         f"1 pod left running: {HINT}")
    none_ok = read_report(write(tmp_path / "n.json", ("default/b", False)), HINT)
    assert none_ok.summary == "podvisor: runonce: 1 of 1 pod failed: default/b"


def test_no_or_bad_results_fail_the_run(tmp_path: Path) -> None:
    assert read_report(tmp_path / "missing.json", HINT).exit_code == 1
    (tmp_path / "bad.json").write_text("{")
    assert "no results" in read_report(tmp_path / "bad.json", HINT).summary
    assert driver_failed("FATAL").exit_code == 1 and INTERRUPTED.exit_code == 1
