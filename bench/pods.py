"""Pods benchmark: podvisor (real agent, embedded runtime) beside supervisord, same run (not a
test; prints figures and ratios).

1. Manifest dropped in `staticPodPath` -> the pod's container running in `/pods`: p50/p99 over
   N pods one at a time (a new manifest each; deleted and gone before the next), and the time
   until M manifests dropped at once (renamed in from a staging dir) are all running. Peers:
   supervisord with M programs (`startsecs=0`), from `update` (reloadConfig + addProcessGroup,
   what `supervisorctl update` does, with supervisord already running: the closest analogue of
   a running agent seeing new manifests) and from a cold `supervisord` start, until
   `getAllProcessInfo` shows all RUNNING; and the floor, M direct `subprocess.Popen`.
2. kill -9 of a container's process -> the replacement running (restartPolicy Always, first
   restart: one fresh pod per kill), polled over CRI every 1 ms (a RUNNING container of that pod
   with restartCount + 1); beside supervisord's autorestart (kill -9 of a program's pid ->
   `getProcessInfo` shows a new pid RUNNING, polled every 1 ms).
3. Idle CPU and RSS over a window with K pods (`sleep`) beside supervisord with K programs, both
   measured in the same window (classification in bench/pods_agent.py).

    .venv/bin/python bench/pods.py [--quick] [-n 20] [--many 200] [--idle-pods 110]
        [--idle-seconds 60] [--stages 1,2,3]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

import psutil
from cri_api.v1 import api_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pods_agent import Agent, pod_name, poll
from pods_idle import measure_idle
from supervisord_peer import Supervisord, free_port, spawn_floor

from podvisor.services.syncloop import labels as L

PR_SET_CHILD_SUBREAPER = 36


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(values: list[float]) -> str:
    return (f"p50 {statistics.median(values) * 1000:7.1f} ms   "
            f"p99 {pct(values, 0.99) * 1000:7.1f} ms   max {max(values) * 1000:7.1f} ms"
            f"   (n={len(values)})")


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b > 0 else "n/a"


# --- 1. manifest to running -------------------------------------------------------------------

def wait_empty(agent: Agent, timeout: float = 180.0) -> None:
    poll(lambda: agent.pod_count() == 0 and not agent.all_containers(), timeout, 0.05,
         "every pod gone from /pods and the runtime")


def one_pod(agent: Agent, n: int) -> list[float]:
    """Manifest -> container running in /pods, one pod at a time; the first is a warm-up."""
    out = []
    for i in range(n + 1):
        name = f"one{i}"
        staged = agent.stage(name)
        t0 = time.monotonic()
        agent.drop(staged)
        wanted = pod_name(name)
        poll(lambda: wanted in agent.running_names(), 60.0, 0.002, f"{name} running")  # noqa: B023
        if i:
            out.append(time.monotonic() - t0)
        (agent.manifests / staged.name).unlink()
        wait_empty(agent)
    return out


def many_pods(agent: Agent, count: int) -> float:
    staged = [agent.stage(f"many{i}") for i in range(count)]
    t0 = time.monotonic()
    for path in staged:
        agent.drop(path)
    poll(lambda: len(agent.running_names()) >= count, 300.0, 0.02, f"{count} pods running")
    took = time.monotonic() - t0
    agent.remove_all()
    wait_empty(agent)
    return took


def supervisord_many(count: int) -> tuple[float, float]:
    """(update -> all RUNNING, cold start -> all RUNNING) for `count` programs."""
    names = [f"p{i}" for i in range(count)]
    sd = Supervisord()
    try:
        sd.start()
        sd.wait_rpc()
        sd.write_programs(names)
        t0 = time.monotonic()
        sd.update()
        update = sd.wait_all_running(count) - t0
    finally:
        sd.stop()
    sd = Supervisord()
    try:
        sd.write_programs(names)
        t0 = sd.start()
        cold = sd.wait_all_running(count) - t0
    finally:
        sd.stop()
    return update, cold


def stage_start(agent: Agent, args: argparse.Namespace) -> None:
    print(f"\n1. manifest -> container running in /pods ({args.n} pods one at a time, "
          f"then {args.many} at once)")
    single = one_pod(agent, args.n)
    print(f"  podvisor, 1 pod               {ms(single)}")
    many = many_pods(agent, args.many)
    update, cold = supervisord_many(args.many)
    floor = spawn_floor(args.many, ["sleep", "3600"])
    print(f"  podvisor, {args.many} pods at once     {many * 1000:8.0f} ms")
    print(f"  supervisord, update -> all RUNNING   {update * 1000:8.0f} ms")
    print(f"  supervisord, cold start -> all RUNNING {cold * 1000:6.0f} ms")
    print(f"  floor, {args.many} x subprocess.Popen     {floor * 1000:8.0f} ms")
    print(f"  ratio podvisor / supervisord (update)     {ratio(many, update)}   target <= 0.5")
    print(f"  ratio podvisor / supervisord (cold start) {ratio(many, cold)}")


# --- 2. kill -9 to replacement running ----------------------------------------------------------

def replacement(agent: Agent, name: str) -> tuple[float, float]:
    """kill -9 the pod's container process; seconds until the runtime reports the old container
    EXITED, and until a RUNNING container of the pod with restartCount + 1 shows over CRI (both
    polled every 1 ms)."""
    [old] = [c for c in agent.containers(name) if c.state == pb.CONTAINER_RUNNING]
    count = int(old.annotations[L.RESTART_COUNT])
    pid = int(agent.started(old.id)["pid"])
    exited: list[float] = []
    t0 = time.monotonic()
    os.kill(pid, 9)

    def new() -> bool:
        found = agent.containers(name)
        if not exited and any(c.id == old.id and c.state == pb.CONTAINER_EXITED for c in found):
            exited.append(time.monotonic())
        return any(c.state == pb.CONTAINER_RUNNING and c.id != old.id
                   and int(c.annotations[L.RESTART_COUNT]) == count + 1 for c in found)
    poll(new, 30.0, 0.001, f"{name} restarted")
    t1 = time.monotonic()
    return (exited[0] if exited else t1) - t0, t1 - t0


def stage_kill(agent: Agent, args: argparse.Namespace) -> None:
    print(f"\n2. kill -9 -> replacement running (first restart, {args.n} kills)")
    names = [f"kill{i}" for i in range(args.n + 1)]
    for path in [agent.stage(n) for n in names]:
        agent.drop(path)
    poll(lambda: len(agent.running_names()) >= len(names), 120.0, 0.05, "kill pods running")
    results = [replacement(agent, n) for n in names][1:]  # the first is a warm-up
    ours = [r[1] for r in results]
    agent.remove_all()
    wait_empty(agent)
    sd = Supervisord()
    try:
        sd.write_programs([f"r{i}" for i in range(args.n + 1)])
        sd.start()
        sd.wait_rpc()
        sd.wait_all_running(args.n + 1)
        theirs = [sd.kill9_restart(f"r{i}") for i in range(args.n + 1)][1:]
    finally:
        sd.stop()
    print(f"  podvisor (CRI poll 1 ms)      {ms(ours)}")
    print(f"    of which kill -> EXITED     {ms([r[0] for r in results])}")
    print(f"  supervisord (XML-RPC 1 ms)    {ms(theirs)}")
    print(f"  ratio podvisor / supervisord (p50) "
          f"{ratio(statistics.median(ours), statistics.median(theirs))}   target <= 1")


# --- 3. idle -------------------------------------------------------------------------------------

def stage_idle(args: argparse.Namespace) -> None:
    print(f"\n3. idle: {args.idle_pods} pods / programs, {args.idle_seconds:.0f} s window "
          f"after {args.settle:.0f} s settling")
    agent = Agent(free_port())
    sd = Supervisord()
    try:
        names = [f"idle{i}" for i in range(args.idle_pods)]
        for path in [agent.stage(n) for n in names]:
            agent.drop(path)
        sd.write_programs([f"i{i}" for i in range(args.idle_pods)])
        sd.start()
        agent.wait_ready()
        t_agent = time.monotonic()
        poll(lambda: len(agent.running_names()) >= args.idle_pods, 300.0, 0.1, "idle pods")
        print(f"  (agent start -> {args.idle_pods} pods running: "
              f"{time.monotonic() - t_agent:.1f} s after the control socket answered)")
        sd.wait_all_running(args.idle_pods)
        if agent.http is not None:
            agent.http.close()
            agent.http = None
        time.sleep(args.settle)
        sd_proc = psutil.Process(sd.proc.pid) if sd.proc else None
        usages = measure_idle([
            ("podvisor agent (all its processes)", agent.agent_processes),
            ("podvisor monitors + containers", agent.pod_processes),
            ("supervisord (daemon only)", lambda: [sd_proc] if sd_proc else []),
        ], args.idle_seconds)
        for usage in usages:
            print(usage.line())
        print("\n".join(usages[0].detail_lines()))
        ours, theirs = usages[0], usages[2]
        print(f"  targets: podvisor CPU <= 1 % ({ours.cpu_percent:.2f}), RSS <= 300 MB "
              f"({ours.rss_mb:.0f}); ratio CPU {ratio(ours.cpu_percent, theirs.cpu_percent)}, "
              f"RSS {ratio(ours.rss_mb, theirs.rss_mb)}")
    finally:
        sd.stop()
        report_leftovers("idle agent", agent.stop())


# --- main ----------------------------------------------------------------------------------------

def report_leftovers(what: str, leftovers: list[str]) -> None:
    if leftovers:
        print(f"  WARNING: {what} left processes behind (killed): {leftovers}")


def _alive_descendants() -> bool:
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            pass
    return False


def descendants_alive() -> list[str]:
    """Reap our zombies; kill (by PID) and list whatever descendant is still alive."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                if proc.ppid() == os.getpid():
                    os.waitpid(proc.pid, os.WNOHANG)
                continue
            out.append(f"{proc.pid} {' '.join(proc.cmdline())[:80]}")
            proc.kill()
        except (psutil.Error, ChildProcessError):
            pass
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="small counts and windows: -n 5 --many 40 --idle-pods 30 "
                         "--idle-seconds 10 --settle 3")
    ap.add_argument("-n", type=int, default=20, help="single-pod and kill samples")
    ap.add_argument("--many", type=int, default=200, help="pods/programs dropped at once")
    ap.add_argument("--idle-pods", type=int, default=110)
    ap.add_argument("--idle-seconds", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=15.0,
                    help="seconds after all are running before the idle window")
    ap.add_argument("--stages", default="1,2,3")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.many, args.idle_pods = min(args.n, 5), min(args.many, 40), 30
        args.idle_seconds, args.settle = min(args.idle_seconds, 10.0), 3.0
    return args


def run(args: argparse.Namespace, stages: set[str]) -> None:
    if stages & {"1", "2"}:
        agent = Agent(free_port())
        try:
            agent.wait_ready()
            if "1" in stages:
                stage_start(agent, args)
            if "2" in stages:
                stage_kill(agent, args)
        finally:
            report_leftovers("agent", agent.stop())
    if "3" in stages:
        stage_idle(args)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    load = os.getloadavg()
    print(f"pods benchmark: {os.cpu_count()} CPUs, load average at start "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (shared machine)")
    try:
        run(args, set(args.stages.split(",")))
    finally:
        # orphaned monitors exit right after their container: give them a moment
        deadline = time.monotonic() + 10.0
        while _alive_descendants() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = descendants_alive()
        if left:
            print(f"WARNING: processes left behind (killed now): {left}")
        load = os.getloadavg()
        print(f"load average at end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
