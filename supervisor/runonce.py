"""RunOnce as the supervisor sees it (`runOnce: true` / `podvisor run --runonce`).

The supervisor runs only the built-ins marked `runonce` in `registry.BUILTINS` (the embedded
runtime, the pod sources and the `runonce` driver, `podvisor.services.syncloop.runonce_main`),
supervised as always: a runtime killed mid-run is restarted and the driver's retries carry the
run on. When the driver returns it has written `run/runonce.json` (`{"results": [{"pod", "uid",
"ok", "state", "message", "tries", "line"}]}`); the supervisor then prints one line per pod on
stdout, a summary on stderr, stops its processes (pods keep running) and exits 0 when every pod
started, 1 otherwise (naming the failed pods), or when the driver failed or was interrupted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podvisor.ipc.paths import RunPaths

__all__ = ["INTERRUPTED", "RESULTS_FILE", "Report", "driver_failed", "read_report", "results_path"]

RESULTS_FILE = "runonce.json"  # the name of RunPaths.runonce_results


def results_path(paths: RunPaths) -> Path:
    return paths.runonce_results


@dataclass(frozen=True)
class Report:
    lines: tuple[str, ...]   # one per pod (or bad input), for stdout
    summary: str             # for stderr
    exit_code: int


def _plural(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"


def driver_failed(state: str) -> Report:
    return Report((), f"podvisor: runonce: the runonce process is {state} (it crashed too "
                      "often); see logs/runonce.log", 1)


INTERRUPTED = Report((), "podvisor: runonce: stopped before every pod was run", 1)


def read_report(path: Path, stop_hint: str) -> Report:
    """The driver's results as printed; a missing or unreadable file is a failed run."""
    try:
        rows: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))["results"]
        lines = tuple(str(r["line"]) for r in rows)
        failed = [str(r["pod"]) for r in rows if not r["ok"]]
        started = sum(1 for r in rows if r["ok"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return Report((), f"podvisor: runonce: no results ({exc})", 1)
    left = f"; {_plural(started)} left running: {stop_hint}" if started else ""
    if failed:
        return Report(lines, f"podvisor: runonce: {len(failed)} of {_plural(len(rows))} failed: "
                             f"{', '.join(failed)}{left}", 1)
    return Report(lines, f"podvisor: runonce: {_plural(started)} started{left}", 0)
