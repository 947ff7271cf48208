"""Manifest -> Running in /pods on containerd (issue 16, item 3), not a test: prints figures.

A real `podvisor run` with `runtimeEndpoint` = containerd (the session's shared instance from
tests/support/containerd.py, e.g. PODVISOR_CONTAINERD_ENDPOINT=unix:///tmp/pvctr/run/
containerd.sock), hostNetwork pods of the test image (`sh -c 'sleep'`). containerd 1.6 has no
event stream, so PLEG relists: every 1 s, and at once on the sync loop's hint (RelistHint).
The time of a pod: from the manifest's rename into staticPodPath to its container running in
GET /pods (polled every 5 ms; the first pod is a warm-up). Then N manifests at once.
The kubelet 1.24 on the same containerd took 0.93-1.08 s for one pod (issue 16).

Then, measured from outside (bench/outside.py: utime+stime+cutime+cstime of every process of a
tree, PSS from smaps_rollup; `--windows` windows of `--window-seconds`, each figure the median
with its range):
- idle with K pods: the agent's process tree, and containerd (daemon + the shims of its socket);
- the floor, no agent: the same N pods made by direct CRI calls (RunPodSandbox, CreateContainer,
  StartContainer from 16 client threads, bench/runtime.py's Target) until the last started,
  and K such pods idle: containerd's own CPU and PSS when nobody relists it.

    .venv/bin/python bench/containerd_pods.py [-n 10] [--many 20] [--idle-pods 110]
        [--windows 5] [--window-seconds 60] [--settle 15] [--detail] [--no-floor] [--json]

PVBENCH_AGENT_CONFIG='{"opsPort": 0}' merges those keys into the agent's config (e.g. to
measure it without an optional subsystem).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))  # tests.support: the session's containerd, /pods

import outside  # noqa: E402

from podvisor.services.cri import new_runtime_client  # noqa: E402
from tests.support.lifecycle import free_port, get_pods  # noqa: E402


def daemon_pid(socket_path: str) -> int | None:
    """The containerd serving `socket_path`: DIR/containerd.pid of the instance dir that holds
    DIR/run/containerd.sock (deploy/containerd/start.sh writes it), if that PID is a
    containerd."""
    path = Path(socket_path).parent.parent / "containerd.pid"
    try:
        pid = int(path.read_text().strip())
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError):
        return None
    return pid if comm == "containerd" else None


def runtime_group(socket_path: str) -> outside.Group:
    pid = daemon_pid(socket_path)
    return outside.Group("containerd (daemon + shims)",
                         outside.containerd_selector(socket_path, lambda: pid))


def _running(doc: dict[str, Any] | None) -> set[str]:
    out = set()
    for pod in (doc or {}).get("items", []):
        statuses = pod.get("status", {}).get("containerStatuses", [])
        if statuses and all("running" in s.get("state", {}) for s in statuses):
            out.add(pod["metadata"]["name"].rsplit("-", 1)[0])
    return out


def _wait(what: str, pred: Any, timeout: float, interval: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def measure(n: int, many: int, idle: int = 0, windows: int = 0, window_s: float = 0.0,
            settle: float = 0.0) -> dict[str, Any]:
    from tests.support import containerd as ctrd  # type: ignore[import-not-found]

    try:
        handle = ctrd.containerd_or_skip()
    except BaseException as err:  # pytest's skip outcome is a BaseException
        return {"error": f"containerd unavailable: {err}"}
    tmp = Path(tempfile.mkdtemp(prefix="pvbc", dir="/tmp"))
    manifests, staging = tmp / "manifests", tmp / "staging"
    manifests.mkdir()
    staging.mkdir()
    port = free_port()
    cgroup_root = f"/podvisor-bench-{os.getpid()}"
    config = {"rootDir": str(tmp / "root"), "nodeName": "bench", "staticPodPath": str(manifests),
              "readOnlyPort": port, "stopPodsOnExit": True, "runtimeEndpoint": handle.endpoint,
              "cgroupRoot": cgroup_root, "supervision": {"shutdownTimeout": "120s"},
              **json.loads(os.environ.get("PVBENCH_AGENT_CONFIG", "{}"))}
    (tmp / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    log = (tmp / "agent.log").open("wb")
    proc = subprocess.Popen([str(BIN / "podvisor"), "run", "--config", str(tmp / "config.yaml")],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    def stage(name: str) -> Path:
        path = staging / f"{name}.yaml"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "c", "image": handle.image,
                                     "imagePullPolicy": "IfNotPresent",
                                     "command": ["sh", "-c", "trap 'exit 0' TERM; "
                                                 "while :; do sleep 1; done"]}]}}),
            encoding="utf-8")
        return path

    def gone() -> bool:
        doc = get_pods(port)
        return doc is not None and not doc.get("items")

    out: dict[str, Any] = {}
    try:
        _wait("the agent's /pods", lambda: get_pods(port) is not None, 60.0, 0.05)
        singles = []
        for i in range(n + 1):
            path = stage(f"one{i}")
            t0 = time.monotonic()
            path.rename(manifests / path.name)
            _wait(f"one{i} running", lambda i=i: f"one{i}" in _running(get_pods(port)), 60.0,
                  0.005)
            if i:
                singles.append(time.monotonic() - t0)
            (manifests / path.name).unlink()
            _wait("no pods", gone, 120.0, 0.05)
        out["one_p50_s"] = statistics.median(singles)
        out["one_min_s"], out["one_max_s"], out["one_n"] = min(singles), max(singles), n
        out["one_s"] = singles
        staged = [stage(f"many{i}") for i in range(many)]
        t0 = time.monotonic()
        for path in staged:
            path.rename(manifests / path.name)
        _wait(f"{many} running", lambda: len(_running(get_pods(port))) >= many, 300.0, 0.02)
        out["many_s"], out["many"] = time.monotonic() - t0, many
        for path in manifests.glob("*.yaml"):
            path.unlink()
        _wait("no pods", gone, 300.0, 0.1)
        if idle and windows:
            out.update(_idle_agent(proc.pid, handle.socket_path, port, manifests,
                                   [stage(f"idle{i}") for i in range(idle)], windows, window_s,
                                   settle))
            for path in manifests.glob("*.yaml"):
                path.unlink()
            _wait("no pods", gone, 300.0, 0.1)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(180)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        ctrd.remove_pod_cgroup(cgroup_root)
        if os.environ.get("PVBENCH_KEEP"):
            print(f"(kept {tmp})")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if "error" not in out and idle and windows and FLOOR:
        out.update(_floor(handle, ctrd.remove_pod_cgroup, many, idle, windows, window_s, settle))
    return out


FLOOR = True  # --no-floor: no agent-less pods and windows after the agent's
DETAIL = False  # --detail: per thread, PSS parts and system calls of each agent process


def _idle_agent(agent_pid: int, socket_path: str, port: int, manifests: Path,
                staged: list[Path], windows: int, window_s: float,
                settle: float) -> dict[str, Any]:
    """K pods running under the agent, then the windows: the agent's tree and containerd's."""
    for path in staged:
        path.rename(manifests / path.name)
    _wait(f"{len(staged)} idle pods running", lambda: len(_running(get_pods(port))) >= len(staged),
          600.0, 0.5)
    time.sleep(settle)  # nobody polls the agent from here: its idle is its own
    groups = [outside.Group("podvisor agent (its whole tree)",
                            outside.tree_selector(lambda: [agent_pid])),
              runtime_group(socket_path)]
    print(f"idle, {len(staged)} pods on containerd, {outside.load()}", flush=True)
    figures = outside.measure(groups, windows, window_s)
    print("\n".join(outside.report(figures)), flush=True)
    agent, runtime = (figures[g.label] for g in groups)
    extra: dict[str, Any] = {}
    if DETAIL:
        extra["detail"] = detail(agent_pid, window_s)
        print(json.dumps(extra["detail"], indent=1), flush=True)
    return {**extra, "idle": len(staged), "idle_load": list(os.getloadavg()),
            "agent_cpu_pct": agent.cpu_pct, "agent_pss_mb": agent.pss_mb,
            "agent_by_process": agent.as_json()["by_process"],
            "runtime_cpu_pct": runtime.cpu_pct, "runtime_pss_mb": runtime.pss_mb,
            "runtime_by_process": runtime.as_json()["by_process"],
            "agent_gone": agent.gone, "runtime_gone": runtime.gone}


def _strace_counts(text: str) -> dict[str, int]:
    """syscall -> calls, from `strace -c` output."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0].replace(".", "").isdigit() and parts[-1] != "total":
            with contextlib.suppress(ValueError):
                out[parts[-1]] = int(parts[3])
    return out


def detail(agent_pid: int, seconds: float) -> dict[str, Any]:
    """Where each of the agent's processes spends its idle CPU and what its PSS is made of:
    per thread name (one window, /proc/PID/task), Pss_Anon / Pss_File (smaps_rollup), and, in
    a second window with `strace -c -f` attached to the three busiest (it slows them: their CPU
    is not read in that window), their system calls per second."""
    proc = outside.Proc()
    stats = proc.stats()
    pids = sorted(outside.tree(stats, [agent_pid]))
    names = {pid: outside.name_of(proc, stats[pid]) for pid in pids}
    before = {pid: proc.threads(pid) for pid in pids}
    t0 = time.monotonic()
    time.sleep(seconds)
    after = {pid: proc.threads(pid) for pid in pids}
    wall = time.monotonic() - t0
    out: dict[str, Any] = {}
    for pid in pids:
        threads = {}
        for tname, (count, ticks) in after[pid].items():
            spent = ticks - before[pid].get(tname, (0, 0))[1]
            if spent > 0:
                threads[f"{tname} x{count}" if count > 1 else tname] = round(
                    100.0 * spent / outside.CLK_TCK / wall, 3)
        out[f"{names[pid]} ({pid})"] = {
            "cpu_pct": round(sum(threads.values()), 3), "threads": threads,
            "pss_kb": proc.pss_parts(pid)}
    busiest = sorted(out, key=lambda k: -out[k]["cpu_pct"])[:3]
    if shutil.which("strace") is not None:
        tracers = []
        for key in busiest:
            pid = int(key.rsplit("(", 1)[1].rstrip(")"))
            path = Path(tempfile.mkstemp(prefix="pvbstrace")[1])
            tracers.append((key, path, subprocess.Popen(
                ["strace", "-c", "-f", "-o", str(path), "-p", str(pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
        t0 = time.monotonic()
        time.sleep(seconds)
        wall = time.monotonic() - t0
        for key, path, tracer in tracers:
            tracer.send_signal(signal.SIGINT)  # strace -c prints its table as it detaches
            try:
                tracer.wait(30)
            except subprocess.TimeoutExpired:
                tracer.kill()
                tracer.wait()
            counts = _strace_counts(path.read_text(errors="replace"))
            path.unlink()
            out[key]["syscalls_per_s"] = {name: round(calls / wall, 1) for name, calls in
                                          sorted(counts.items(), key=lambda kv: -kv[1])[:8]}
    return out


def _floor(handle: Any, remove_cgroup: Any, many: int, idle: int, windows: int,
           window_s: float, settle: float) -> dict[str, Any]:
    """No agent: `many` pods by direct CRI calls from 16 threads (the floor of a burst), then
    `idle` pods and containerd's windows alone."""
    from runtime import Target  # type: ignore[import-not-found]

    client = new_runtime_client(handle.endpoint, timeout=120.0)
    target = Target("containerd", client, handle.image, handle.cgroup_parent, remove_cgroup)
    out: dict[str, Any] = {}
    try:
        t0 = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda _: target.container(target.sandbox(), "main"), range(many)))
        out["floor_many_s"] = time.monotonic() - t0
        target.clean()
        for _ in range(idle):
            target.container(target.sandbox(), "main")
        time.sleep(settle)
        group = runtime_group(handle.socket_path)
        print(f"idle, {idle} pods on containerd, no agent, {outside.load()}", flush=True)
        figures = outside.measure([group], windows, window_s)
        print("\n".join(outside.report(figures)), flush=True)
        fig = figures[group.label]
        out.update(floor_runtime_cpu_pct=fig.cpu_pct, floor_runtime_pss_mb=fig.pss_mb,
                   floor_load=list(os.getloadavg()))
    finally:
        target.clean()
        shutil.rmtree(target.tmp, ignore_errors=True)
        client.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=10, help="single pods, one at a time")
    ap.add_argument("--many", type=int, default=20, help="pods dropped at once")
    ap.add_argument("--idle-pods", type=int, default=110, help="pods of the idle windows")
    ap.add_argument("--windows", type=int, default=5, help="idle windows (0: no idle stage)")
    ap.add_argument("--window-seconds", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=15.0,
                    help="seconds after all are running before the first window")
    ap.add_argument("--detail", action="store_true",
                    help="after the idle windows: each agent process's CPU per thread, its "
                         "PSS parts, and (strace -c) the system calls of the busiest three")
    ap.add_argument("--no-floor", action="store_true",
                    help="skip the floor (pods by direct CRI calls, no agent)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    global DETAIL, FLOOR
    DETAIL, FLOOR = args.detail, not args.no_floor
    load = os.getloadavg()
    figures = measure(args.n, args.many, args.idle_pods, args.windows, args.window_seconds,
                      args.settle)
    figures["load"] = [round(x, 2) for x in load]
    if args.json:
        print(json.dumps(figures, sort_keys=True))
    elif "error" in figures:
        print(f"containerd: {figures['error']}")
    else:
        print(f"on containerd (load {load[0]:.2f}, shared machine):\n"
              f"  1 manifest -> Running in /pods  p50 {figures['one_p50_s'] * 1000:6.0f} ms "
              f"(min {figures['one_min_s'] * 1000:.0f}, max {figures['one_max_s'] * 1000:.0f}, "
              f"n={args.n})   target <= 300 ms; the kubelet 1.24: 930-1,080 ms\n"
              f"  {args.many} at once -> all Running   {figures['many_s'] * 1000:6.0f} ms")
    return 1 if "error" in figures else 0


if __name__ == "__main__":
    sys.exit(main())
