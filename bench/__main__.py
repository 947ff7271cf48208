"""`python -m bench [--quick] [--json] [--list]`: every benchmark with a machine-readable output,
one table (not a test; prints figures, asserts nothing).

Each stage is one of the bench/*.py scripts run with `--json` as a subprocess in its own process
group (its own session), stopped by PID (the group's leader, then the group) on timeout; the
script's last stdout line is its JSON figures. A stage that fails or times out leaves its
figures' rows saying so ("missing: <why>") and the other stages run. Each figure is the median
of its samples (repeats of the stage, or the samples one run takes) with min and max.

Peers in the same run: raw pyzmq+msgpack for the bus, supervisord and circus (each in its own
virtualenv under ~/.cache/podvisor/bench-peers, from PyPI: bench/supervisord_peer.py,
bench/circus_peer.py), containerd when PODVISOR_CONTAINERD_ENDPOINT is set (with the same CRI
calls made directly to it, no agent, as the floor), the kubelet on a private containerd of its
own when PODVISOR_BENCH_KUBELET names a kubelet binary (bench/kubelet_peer.py), and `podman kube
play` on the same Pod YAML (bench/podman_peer.py: Debian's podman, as root, in a private temp root
removed afterwards; its rows say why when it cannot run). Idle CPU and memory are measured as
from outside (bench/outside.py): utime+stime+cutime+cstime of every process of a tree from /proc
(children the agent reaps count) and PSS from smaps_rollup, over several windows, each window a
sample; compare the ratio to a peer of the same run, not the bare percentages (they move 4-5x
with the host's load). Scripts without `--json` (runtime,
limits, images, mainport, ops, api) are listed by `--list` and run on their own.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

BENCH = Path(__file__).resolve().parent
PEERS = Path.home() / ".cache" / "podvisor" / "bench-peers"

Samples = list[float]


@dataclass
class Row:
    """One figure of the table: podvisor's samples, one peer's, a target."""

    figure: str
    unit: str
    target: str = ""
    peer: str = ""
    ours: Samples = field(default_factory=list)
    theirs: Samples = field(default_factory=list)
    missing: str = ""
    lower_is_better: bool = True
    key: str = ""  # a name for ours_from
    ours_from: str = ""  # podvisor's samples are those of the row with this key (same run)


@dataclass(frozen=True)
class Stage:
    name: str
    script: str
    quick_args: tuple[str, ...]
    full_args: tuple[str, ...]
    timeout_quick: float
    timeout_full: float
    repeats_quick: int
    repeats_full: int
    rows: Callable[[], list[Row]]
    fill: Callable[[list[Row], dict[str, Any]], None]
    needs: Callable[[], str] = lambda: ""  # a reason to skip, or ""
    grace: float = 10.0  # seconds between SIGTERM and SIGKILL when the stage is stopped


# --- stages ----------------------------------------------------------------------------------

def _bus_rows() -> list[Row]:
    return [Row("bus throughput, 200 B msgpack dicts", "msg/s", ">= 0.5x raw",
                "raw pyzmq+msgpack", lower_is_better=False),
            Row("bus latency p99 at 1k msg/s", "ms", "<= 2x raw", "raw pyzmq+msgpack")]


def _bus_fill(rows: list[Row], out: dict[str, Any]) -> None:
    # a run whose bus delivered nothing, or whose latency run got no sample (NaN), is no sample
    for row, key in ((rows[0], "throughput"), (rows[1], "p99_ms")):
        for samples, res in ((row.ours, out["podvisor bus"]),
                             (row.theirs, out["raw pyzmq+msgpack"])):
            if res["delivered"] > 0 and math.isfinite(res[key]):
                samples.append(res[key])


def _restart_rows() -> list[Row]:
    return [Row("supervised process: kill -9 -> death seen on the bus", "ms"),
            Row("supervised process: kill -9 -> restarted (first heartbeat)", "ms")]


def _restart_fill(rows: list[Row], out: dict[str, Any]) -> None:
    rows[0].ours.extend(out["detect_ms"])
    rows[1].ours.extend(out["restart_ms"])


def _pods_rows() -> list[Row]:
    return [Row("1 manifest -> running in /pods (embedded runtime)", "ms", key="one"),
            Row("N manifests at once -> all running", "ms", "<= 0.7x supervisord update",
                "supervisord update", key="many"),
            Row("N at once: agent vs the CRI-alone floor", "ms", "<= 1.2x floor",
                "CRI alone (no agent)"),
            Row("container kill -9 -> replacement running", "ms", "<= 1x supervisord polled",
                "supervisord, polled 1 ms", key="kill")]


def _pods_fill(rows: list[Row], out: dict[str, Any]) -> None:
    rows[0].ours.extend(s * 1e3 for s in out["one_pod_s"])
    for row in rows[1:3]:
        row.figure = row.figure.replace("N ", f"{out['many']} ", 1)
        row.ours.append(out["many_s"] * 1e3)
    rows[1].theirs.append(out["supervisord_update_s"] * 1e3)
    rows[2].theirs.append(out["cri_floor_s"] * 1e3)
    if "kill_s" in out:
        rows[3].ours.extend(s * 1e3 for s in out["kill_s"])
        rows[3].theirs.extend(s * 1e3 for s in out["supervisord_kill_polled_s"])


def _circus_rows() -> list[Row]:
    return [Row("N at once -> all running, beside circus", "ms", "-",
                "circusd cold start, N watchers", ours_from="many"),
            Row("container kill -9 -> replacement running, beside circus", "ms", "-",
                "circus (check_delay 5 s default)", ours_from="kill")]


def _circus_fill(rows: list[Row], out: dict[str, Any]) -> None:
    if "error" in out:
        raise RuntimeError(str(out["error"]))
    rows[0].figure = rows[0].figure.replace("N ", f"{out['many']} ", 1)
    rows[0].peer = rows[0].peer.replace("N ", f"{out['many']} ", 1)
    rows[0].theirs.append(out["cold_s"] * 1e3)
    rows[1].theirs.extend(s * 1e3 for s in out["kill_s"])


OUTSIDE = "from /proc: whole tree, reaped children in, median of windows"


def _containerd_rows() -> list[Row]:
    floor = "same CRI calls direct to containerd (no agent)"
    return [Row("on containerd: 1 manifest -> Running in /pods", "ms",
                "<= 300 ms (kubelet 1.24: 930-1,080 ms)", key="ctr_one"),
            Row("on containerd: N manifests at once -> all Running", "ms", "<= 1.1x floor",
                floor, key="ctr_many"),
            Row(f"on containerd, K pods idle: agent CPU ({OUTSIDE})", "% of a core",
                key="ctr_agent_cpu"),
            Row("on containerd, K pods idle: agent PSS", "MB", key="ctr_agent_pss"),
            Row("on containerd, K pods idle: containerd + shims CPU, under the agent",
                "% of a core", "-", "containerd + shims, pods by direct CRI, no agent",
                key="ctr_runtime_cpu"),
            Row("on containerd, K pods idle: containerd + shims PSS, under the agent", "MB",
                "-", "containerd + shims, pods by direct CRI, no agent", key="ctr_runtime_pss"),
            Row("on containerd, K pods idle: agent + containerd CPU", "% of a core",
                key="ctr_total_cpu"),
            Row("on containerd, K pods idle: agent + containerd PSS", "MB", key="ctr_total_pss")]


def _sums(a: list[float], b: list[float]) -> list[float]:
    """Window by window (the same windows measured both)."""
    return [x + y for x, y in zip(a, b, strict=True)]


def _containerd_fill(rows: list[Row], out: dict[str, Any]) -> None:
    if "error" in out:
        raise RuntimeError(str(out["error"]))
    rows[0].ours.extend(s * 1e3 for s in out["one_s"])
    rows[1].figure = rows[1].figure.replace("N ", f"{out['many']} ", 1)
    rows[1].ours.append(out["many_s"] * 1e3)
    if "floor_many_s" in out:
        rows[1].theirs.append(out["floor_many_s"] * 1e3)
    if "agent_cpu_pct" not in out:
        for row in rows[2:]:
            row.missing = "skipped: no idle windows (--windows 0)"
        return
    for row in rows[2:]:
        row.figure = row.figure.replace("K ", f"{out['idle']} ", 1)
    rows[2].ours.extend(out["agent_cpu_pct"])
    rows[3].ours.extend(out["agent_pss_mb"])
    rows[4].ours.extend(out["runtime_cpu_pct"])
    rows[5].ours.extend(out["runtime_pss_mb"])
    rows[4].theirs.extend(out.get("floor_runtime_cpu_pct", []))
    rows[5].theirs.extend(out.get("floor_runtime_pss_mb", []))
    rows[6].ours.extend(_sums(out["agent_cpu_pct"], out["runtime_cpu_pct"]))
    rows[7].ours.extend(_sums(out["agent_pss_mb"], out["runtime_pss_mb"]))


def _kubelet_rows() -> list[Row]:
    peer = "kubelet + containerd (its own)"
    return [Row("kubelet peer: 1 manifest -> Running in /pods", "ms", "-", peer,
                ours_from="ctr_one"),
            Row("kubelet peer: N manifests at once -> all Running", "ms", "-", peer,
                ours_from="ctr_many"),
            Row("kubelet peer, K pods idle: agent CPU (podvisor on containerd)", "% of a core",
                "<= 0.5x kubelet", f"{peer}: the kubelet", ours_from="ctr_agent_cpu"),
            Row("kubelet peer, K pods idle: agent PSS (podvisor on containerd)", "MB",
                "<= 1x kubelet", f"{peer}: the kubelet", ours_from="ctr_agent_pss"),
            Row("kubelet peer, K pods idle: containerd + shims CPU", "% of a core", "-",
                f"{peer}: its containerd", ours_from="ctr_runtime_cpu"),
            Row("kubelet peer, K pods idle: agent + containerd CPU", "% of a core", "-",
                peer, ours_from="ctr_total_cpu"),
            Row("kubelet peer, K pods idle: agent + containerd PSS", "MB", "-", peer,
                ours_from="ctr_total_pss"),
            Row("kubelet peer, K pods idle: embedded runtime CPU (agent + monitors)",
                "% of a core", "<= 0.5x kubelet + containerd", peer, ours_from="emb_total_cpu"),
            Row("kubelet peer, K pods idle: embedded runtime PSS (agent + monitors)", "MB",
                "-", peer, ours_from="emb_total_pss")]


def _kubelet_fill(rows: list[Row], out: dict[str, Any]) -> None:
    if "error" in out:
        raise RuntimeError(str(out["error"]))
    for row in rows:
        row.peer = row.peer.replace("kubelet +", f"kubelet {out['version']} +", 1)
        for letter, key in (("N ", "many"), ("K ", "idle")):
            if key in out:
                row.figure = row.figure.replace(letter, f"{out[key]} ", 1)
    rows[0].theirs.extend(s * 1e3 for s in out["one_s"])
    rows[1].theirs.append(out["many_s"] * 1e3)
    if "agent_cpu_pct" not in out:
        return
    total_cpu = _sums(out["agent_cpu_pct"], out["runtime_cpu_pct"])
    total_pss = _sums(out["agent_pss_mb"], out["runtime_pss_mb"])
    for row, samples in zip(rows[2:], (out["agent_cpu_pct"], out["agent_pss_mb"],
                                       out["runtime_cpu_pct"], total_cpu, total_pss,
                                       total_cpu, total_pss), strict=True):
        row.theirs.extend(samples)


def _kubelet_needs() -> str:
    sys.path.insert(0, str(BENCH))
    from kubelet_peer import needs  # type: ignore[import-not-found]

    why: str = needs()
    return why


def _idle_rows() -> list[Row]:
    peer = "supervisord (daemon, same windows)"
    return [Row(f"idle, K pods, embedded: agent CPU ({OUTSIDE})", "% of a core",
                "<= 3x supervisord", peer, key="idle_cpu"),
            Row("idle, K pods, embedded: agent PSS (all its processes)", "MB", "<= 150 MB",
                peer, key="idle_mem"),
            Row("idle, K pods, embedded: agent + container monitors CPU", "% of a core",
                key="emb_total_cpu"),
            Row("idle, K pods, embedded: agent + container monitors PSS", "MB",
                key="emb_total_pss")]


def _idle_fill(rows: list[Row], out: dict[str, Any]) -> None:
    for row in rows:
        row.figure = row.figure.replace("K ", f"{out['idle_pods']} ", 1)
    rows[0].ours.extend(out["idle_cpu_pct"])
    rows[0].theirs.extend(out["supervisord_idle_cpu_pct"])
    rows[1].ours.extend(out["idle_pss_mb"])
    rows[1].theirs.extend(out["supervisord_idle_pss_mb"])
    rows[2].ours.extend(out["idle_total_cpu_pct"])
    rows[3].ours.extend(out["idle_total_pss_mb"])


def _podman_rows() -> list[Row]:
    peer = "podman kube play"
    return [Row("1 manifest -> running, beside podman", "ms", "-", peer, ours_from="one"),
            Row("N manifests at once -> all running, beside podman", "ms", "-",
                f"{peer} (one file of N pods)", ours_from="many"),
            Row("container kill -9 -> replacement running, beside podman", "ms", "-",
                f"{peer} (restartPolicy Always)", ours_from="kill"),
            # podman's figures are still its stage's own (one window, user+system of its
            # processes, distinct resident pages): not the outside measurement of ours
            Row("idle, K pods: CPU, beside podman", "% of a core", "-",
                "podman (a conmon per container; own ticks only)", ours_from="idle_cpu"),
            Row("idle, K pods: memory (ours PSS), beside podman", "MB", "-",
                "podman (resident distinct pages)", ours_from="idle_mem")]


def _podman_fill(rows: list[Row], out: dict[str, Any]) -> None:
    if "error" in out:
        raise RuntimeError(str(out["error"]))
    for row in rows:
        for letter, key in (("N ", "many"), ("K ", "idle_pods")):
            row.figure = row.figure.replace(letter, f"{out[key]} ", 1)
            row.peer = row.peer.replace(f"of {letter}", f"of {out[key]} ", 1)
    rows[0].theirs.extend(s * 1e3 for s in out["one_s"])
    rows[1].theirs.append(out["many_s"] * 1e3)
    rows[2].theirs.extend(s * 1e3 for s in out["kill_s"])
    rows[3].theirs.append(out["idle_cpu_pct"])
    rows[4].theirs.append(out["idle_resident_mb"])


def _podman_needs() -> str:
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman; .ci/test-packages.txt)"
    if os.geteuid() != 0:
        return "podman needs root here (rootless podman needs subuids and a user namespace)"
    return ""


def _containerd_needs() -> str:
    if not os.environ.get("PODVISOR_CONTAINERD_ENDPOINT"):
        return "PODVISOR_CONTAINERD_ENDPOINT is not set"
    return ""


STAGES: tuple[Stage, ...] = (
    Stage("bus", "bus.py", ("--messages", "20000", "--rate-seconds", "0.5"),
          ("--messages", "200000", "--rate-seconds", "3"), 60, 300, 3, 5, _bus_rows, _bus_fill),
    Stage("restart", "restart.py", ("-n", "5"), ("-n", "50"), 60, 300, 1, 1,
          _restart_rows, _restart_fill),
    Stage("pods", "pods.py", ("--quick", "--stages", "1,2"), ("--stages", "1,2"), 120, 900,
          1, 1, _pods_rows, _pods_fill),
    Stage("circus", "circus_peer.py", ("--many", "40", "-n", "3"), ("--many", "200", "-n", "10"),
          120, 300, 1, 1, _circus_rows, _circus_fill),
    # the windows are the samples of the idle figures: one run (its 110 at once is 1 sample)
    Stage("containerd", "containerd_pods.py",
          ("-n", "4", "--many", "10", "--idle-pods", "10", "--windows", "3",
           "--window-seconds", "5", "--settle", "2"),
          ("-n", "10", "--many", "110", "--idle-pods", "110", "--windows", "5",
           "--window-seconds", "60", "--settle", "15"), 240, 1800, 1, 1, _containerd_rows,
          _containerd_fill, _containerd_needs, grace=120.0),
    # its rows' podvisor figures are the containerd and idle stages' (ours_from, joined after
    # every stage ran); in --quick the embedded idle has 40 pods, the kubelet's 10
    Stage("kubelet", "kubelet_peer.py",
          ("-n", "4", "--many", "10", "--idle-pods", "10", "--windows", "3",
           "--window-seconds", "5", "--settle", "2"),
          ("-n", "10", "--many", "110", "--idle-pods", "110", "--windows", "5",
           "--window-seconds", "60", "--settle", "15"), 300, 1800, 1, 1, _kubelet_rows,
          _kubelet_fill, _kubelet_needs, grace=120.0),
    # the idle window without --quick's 30 pods: 40 (quick) as the podman stage keeps
    Stage("idle", "pods.py", ("--stages", "3", "--idle-pods", "40", "--idle-seconds", "5",
                              "--windows", "3", "--settle", "3"), ("--stages", "3"), 120, 900,
          1, 1, _idle_rows, _idle_fill),
    # its N is the pods stage's (40 / 200), its K the idle stage's (40 / 110)
    Stage("podman", "podman_peer.py", ("--many", "40", "--idle-pods", "40", "-n", "3", "-k", "3",
                                       "--idle-seconds", "10"),
          ("--many", "200", "--idle-pods", "110", "-n", "10", "-k", "10", "--idle-seconds", "60"),
          300, 1500, 1, 1, _podman_rows, _podman_fill, _podman_needs, grace=180.0),
)

# bench scripts without `--json`: run on their own, not in the table
TEXT_ONLY = ("runtime.py", "limits.py", "images.py", "mainport.py", "ops.py", "api.py",
             "pod_wire.py")


# --- running a stage -------------------------------------------------------------------------

def _kill_group(proc: subprocess.Popen[str], grace: float = 10.0) -> None:
    """The stage's session leader is proc.pid: its group id is its PID. Its descendants are
    listed first (psutil) and each one still alive afterwards is killed by its PID, so that a
    container or peer that made its own session or group goes too."""
    descendants: list[psutil.Process] = []
    if proc.poll() is None:  # once reaped, its PID may be another process's
        with contextlib.suppress(psutil.Error):
            descendants = psutil.Process(proc.pid).children(recursive=True)
    _signal_group(proc, grace)
    for child in descendants:
        with contextlib.suppress(psutil.Error):
            child.kill()


def _signal_group(proc: subprocess.Popen[str], grace: float) -> None:
    """SIGTERM, `grace` seconds for the stage's own cleanup, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run_stage(stage: Stage, quick: bool, log: Any) -> tuple[list[Row], float]:
    rows = stage.rows()
    started = time.monotonic()
    why = stage.needs()
    if why:
        for row in rows:
            row.missing = f"skipped: {why}"
        return rows, 0.0
    args = stage.quick_args if quick else stage.full_args
    timeout = stage.timeout_quick if quick else stage.timeout_full
    repeats = stage.repeats_quick if quick else stage.repeats_full
    env = {**os.environ, "PVBENCH_SUPERVISORD_VENV": str(PEERS / "supervisord"),
           "PVBENCH_CIRCUS_VENV": str(PEERS / "circus")}
    for _ in range(repeats):
        cmd = [sys.executable, str(BENCH / stage.script), *args, "--json"]
        print(f"[{stage.name}] {' '.join(cmd[1:])}", file=log, flush=True)
        proc = subprocess.Popen(cmd, cwd=BENCH.parent, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            text, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc, stage.grace)
            _mark(rows, f"missing: stage {stage.name} timed out after {timeout:.0f} s "
                        "(killed)")
            return rows, time.monotonic() - started
        finally:
            _kill_group(proc, stage.grace)  # anything of its group still alive goes with it
        lines = text.strip().splitlines()
        log.write(text)
        try:
            stage.fill(rows, json.loads(lines[-1]))
        except (IndexError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            tail = lines[-1][:120] if lines else "no output"
            _mark(rows, f"missing: stage {stage.name} failed (exit {proc.returncode}; "
                        f"{type(exc).__name__}: {exc}; last line: {tail})")
            return rows, time.monotonic() - started
    return rows, time.monotonic() - started


def _mark(rows: list[Row], why: str) -> None:
    for row in rows:
        if not row.ours and not row.theirs:
            row.missing = why


# --- table -----------------------------------------------------------------------------------

def summary(samples: Samples) -> dict[str, float] | None:
    if not samples:
        return None
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "n": len(samples)}


def _cell(samples: Samples, unit: str) -> str:
    s = summary(samples)
    if s is None:
        return "-"
    fmt = "{:,.0f}" if s["median"] >= 100 else "{:.1f}" if s["median"] >= 1 else "{:.2f}"
    return (f"{fmt.format(s['median'])} {unit} ({fmt.format(s['min'])}-"
            f"{fmt.format(s['max'])}, n={s['n']:.0f})")


def ratio(row: Row) -> float | None:
    if row.ours and row.theirs and statistics.median(row.theirs) > 0:
        return statistics.median(row.ours) / statistics.median(row.theirs)
    return None  # no pair, or a peer figure of 0 (e.g. an idle CPU below the clock's tick)


def _ratio_cell(rat: float | None) -> str:
    if rat is None:
        return "-"
    return f"{rat:.2f}x" if rat >= 0.1 else f"{rat:.3f}x"


def machine(load_start: tuple[float, ...]) -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model or platform.processor(),
            "load_start": [round(x, 2) for x in load_start],
            "load_end": [round(x, 2) for x in os.getloadavg()],
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "python": platform.python_version()}


def table(rows: list[Row], mach: dict[str, Any]) -> str:
    head = ("figure", "podvisor", "peer", "peer figure", "ratio", "target")
    body = []
    for r in rows:
        rat = ratio(r)
        body.append((r.figure, r.missing or _cell(r.ours, r.unit), r.peer or "-",
                     _cell(r.theirs, r.unit) if r.theirs else "-",
                     _ratio_cell(rat), r.target or "-"))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    lines.append(f"\nmachine: {mach['cpus']} CPUs ({mach['cpu_model']}), load average "
                 f"{' '.join(map(str, mach['load_start']))} at start, "
                 f"{' '.join(map(str, mach['load_end']))} at end; {mach['date']}")
    return "\n".join(lines)


def as_json(rows: list[Row], mach: dict[str, Any]) -> dict[str, Any]:
    return {"machine": mach, "figures": [
        {"figure": r.figure, "unit": r.unit, "podvisor": summary(r.ours), "peer": r.peer or None,
         "peer_figure": summary(r.theirs), "ratio": ratio(r), "target": r.target or None,
         "missing": r.missing or None} for r in rows]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts (under 3 minutes)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--list", action="store_true", help="list the stages and exit")
    ap.add_argument("--stages", default=",".join(s.name for s in STAGES),
                    help="comma-separated stage names")
    args = ap.parse_args(argv)
    names = args.stages.split(",")
    unknown = set(names) - {s.name for s in STAGES}
    if unknown:
        ap.error(f"unknown stage(s): {', '.join(sorted(unknown))}")
    if args.list:
        for s in STAGES:
            figures = "; ".join(r.figure for r in s.rows())
            print(f"{s.name:<11} bench/{s.script} {' '.join(s.quick_args)} --json   {figures}")
        print(f"{'-':<11} text only (run on their own): {', '.join(TEXT_ONLY)}")
        return 0
    load = os.getloadavg()
    rows: list[Row] = []
    log = sys.stderr
    for stage in STAGES:
        if stage.name in names:
            stage_rows, secs = run_stage(stage, args.quick, log)
            print(f"[{stage.name}] {secs:.0f} s", file=log, flush=True)
            rows += stage_rows
    by_key = {r.key: r for r in rows if r.key}
    for r in rows:
        if r.ours_from:
            source = by_key.get(r.ours_from)
            if source is not None and source.ours:
                r.ours = list(source.ours)
            elif not r.missing:
                r.missing = ("missing: no podvisor figure in this run (the stage with it did "
                             "not run or failed)")
    mach = machine(load)
    print(json.dumps(as_json(rows, mach), indent=1) if args.json else table(rows, mach))
    return 0 if all(not r.missing or r.missing.startswith("skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
