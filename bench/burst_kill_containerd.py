"""Burst + kill -9 on containerd (issue 22, "On containerd: N rounds, one task per pod"), not a
test: prints figures.

A real `podvisor run` with `runtimeEndpoint` = a PRIVATE containerd this script sets up with
deploy/containerd/setup.sh + start.sh (no pod network: the pods are hostNetwork) and stops with
stop.sh --purge at the end (never the session's instance: a kill of containerd needs its own,
and a call cancelled by the sync loop's death can leave one of containerd's shims behind,
which would stay on a shared instance). Then N rounds of: P pods of the busybox test image,
each running `sleep <tag>` (a number unique to the pod and round, so the kernel's process
table can count each pod's processes), dropped into staticPodPath at once; once the first K
containers run, SIGKILL of the agent's sync loop (`--kill syncloop`, the default) or of
containerd itself (`--kill containerd`: by its pid, then start.sh again).
Per round: all pods Running in /pods (yes/no) and the time from the kill to that (for containerd
also from its restart's answer), the live processes of each pod's command (must be exactly 1),
sandboxes / ready sandboxes / containers / running containers (tasks) per pod in containerd's
CRI list, pods with a restart counted, then the manifests are removed and what is left: live
processes of the round's commands once the pods are gone (0 expected), sandboxes, and
containerd-shim processes of the instance (containerd's own leak, reported, not podvisor's:
an idle shim holds no process of the pod).

    .venv/bin/python bench/burst_kill_containerd.py [--rounds 10] [--pods 40] [--after 5]
        [--kill syncloop|containerd|none] [--json]

`--kill none` runs the same rounds without a kill: "kill -> all Running" is then the time from
the moment the kill would have come to all pods Running (the burst's own pace, for comparison).

PVBENCH_KEEP=1 keeps the temp dir (the agent's logs, the private instance's containerd.log).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml
from cri_api.v1 import api_pb2 as pb

from podvisor.ipc.control import ControlClient
from podvisor.ipc.paths import RunPaths
from podvisor.services.cri import CriError, new_runtime_client
from podvisor.services.cri.client import RuntimeClient
from podvisor.services.syncloop import labels as L

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.support: the private containerd, the burst's counting
from tests.support.burst import (  # noqa: E402
    CriCounts,
    PrivateContainerd,
    base_name,
    in_cgroups,
    running_pods,
    sleep_manifest,
    sleepers,
)
from tests.support.lifecycle import free_port, get_pods  # noqa: E402

BIN = Path(sys.executable).parent
IMAGE = "localhost/podvisor/busybox:1"


def _wait(what: str, pred: Callable[[], Any], timeout: float, interval: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Private(PrivateContainerd):
    """The script's own containerd; PVBENCH_KEEP keeps the log of each incarnation (start.sh
    keeps only the last two)."""

    def kill9(self) -> None:
        super().kill9()
        self.keep_log()

    def keep_log(self) -> None:
        if os.environ.get("PVBENCH_KEEP") and (self.dir / "containerd.log").exists():
            with (self.dir.parent / "containerd.logs").open("ab") as out:
                out.write((self.dir / "containerd.log").read_bytes())

    def stop(self) -> None:
        self.keep_log()
        super().stop()


@dataclass
class Round:
    running_at_kill: int = 0
    all_running: bool = False
    kill_to_running_s: float = 0.0
    back_to_running_s: float = 0.0  # --kill containerd: from its restart's answer
    processes: dict[int, int] = field(default_factory=dict)   # processes per pod -> pods
    sandboxes: dict[int, int] = field(default_factory=dict)   # sandboxes per pod -> pods
    ready: dict[int, int] = field(default_factory=dict)       # ready sandboxes per pod -> pods
    containers: dict[int, int] = field(default_factory=dict)  # containers per pod -> pods
    tasks: dict[int, int] = field(default_factory=dict)       # running containers per pod
    restarted: int = 0  # pods with a restart counted
    dead: list[str] = field(default_factory=list)  # containers not running: how they ended
    left_processes: int = -1  # after the manifests are removed and the pods are gone
    left_sandboxes: int = -1
    left_shims: int = -1  # containerd-shim processes of the instance after removal
    left_in_cgroups: list[str] = field(default_factory=list)  # any process of the pods' cgroups
    error: str = ""


class Bench:
    def __init__(self, tmp: Path, endpoint: str, pods: int, after: int,
                 shims: Callable[[], list[psutil.Process]]) -> None:
        self.tmp, self.endpoint, self.n, self.after = tmp, endpoint, pods, after
        self.shims = shims
        self.manifests, self.staging = tmp / "manifests", tmp / "staging"
        self.manifests.mkdir()
        self.staging.mkdir()
        self.port = free_port()
        self.cgroup_root = f"/podvisor-bench-{os.getpid()}"
        self.paths = RunPaths(tmp / "root")
        self.cri: RuntimeClient = new_runtime_client(endpoint, timeout=10.0)
        self.proc: subprocess.Popen[bytes] | None = None
        self.tags: dict[str, str] = {}

    def start_agent(self) -> None:
        config = {"rootDir": str(self.paths.root), "nodeName": "bench",
                  "staticPodPath": str(self.manifests), "readOnlyPort": self.port, "port": 0,
                  "opsPort": 0, "stopPodsOnExit": True, "runtimeEndpoint": self.endpoint,
                  "cgroupRoot": self.cgroup_root, "supervision": {"shutdownTimeout": "120s"}}
        (self.tmp / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        log = (self.tmp / "agent.log").open("wb")
        self.proc = subprocess.Popen(
            [str(BIN / "podvisor"), "run", "--config", str(self.tmp / "config.yaml")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        log.close()
        _wait("the agent's /pods", lambda: get_pods(self.port) is not None, 60.0, 0.05)

    def stop_agent(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(180)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill_syncloop(self) -> None:
        ControlClient(self.paths.control, timeout=10.0).call("kill", name="syncloop",
                                                             signal="KILL")

    def ours(self, labels: Any) -> str | None:
        name = base_name(labels.get(L.POD_NAME, ""))
        return name if name in self.tags else None

    def running_containers(self) -> int:
        try:
            return sum(1 for c in self.cri.list_containers()
                       if c.state == pb.CONTAINER_RUNNING and self.ours(c.labels))
        except CriError:
            return 0

    def all_running(self) -> bool:
        return running_pods(get_pods(self.port)) >= set(self.tags)

    def sleepers(self) -> Counter[str]:
        return Counter({pod: n for pod, n in sleepers(self.tags).items() if n})

    def per_pod(self, counts: Counter[str]) -> dict[int, int]:
        """count per pod -> how many pods have it."""
        return dict(sorted(Counter(counts.get(pod, 0) for pod in self.tags).items()))

    def tally(self, r: Round) -> None:
        c = CriCounts.of(self.cri, self.ours, describe_dead=True)
        r.dead.extend(c.dead)
        restarted = {pod for pod, counts in c.restarts.items() if any(counts)}
        for pod in (get_pods(self.port) or {}).get("items", []):
            name = base_name(pod["metadata"]["name"])
            if name in self.tags and any(c.get("restartCount", 0) > 0 for c in
                                         pod["status"].get("containerStatuses", [])):
                restarted.add(name)
        r.sandboxes, r.ready = self.per_pod(c.sandboxes), self.per_pod(c.ready)
        r.containers, r.tasks = self.per_pod(c.containers), self.per_pod(c.running)
        r.processes, r.restarted = self.per_pod(self.sleepers()), len(restarted)

    def gone(self) -> bool:
        body = get_pods(self.port)
        if body is None or any(base_name(p["metadata"]["name"]) in self.tags
                               for p in body.get("items", [])):
            return False
        try:
            return (not any(self.ours(s.labels) for s in self.cri.list_pod_sandbox())
                    and not any(self.ours(c.labels) for c in self.cri.list_containers()))
        except CriError:
            return False

    def round(self, i: int, kill: Callable[[], float | None]) -> Round:
        """One round; ``kill`` does the kill and returns when the runtime answered again
        (monotonic), or None when the runtime was not what was killed."""
        base = 800000000 + secrets.randbelow(100000) * 1000
        self.tags = {f"r{i}p{j}": str(base + j) for j in range(self.n)}
        for name, tag in self.tags.items():
            (self.staging / f"{name}.yaml").write_text(
                yaml.safe_dump(sleep_manifest(name, IMAGE, tag)), encoding="utf-8")
        r = Round()
        for name in self.tags:
            (self.staging / f"{name}.yaml").rename(self.manifests / f"{name}.yaml")
        r.running_at_kill = _wait("the first containers", lambda: (
            n if (n := self.running_containers()) >= self.after else 0), 120.0, 0.005)
        t_kill = time.monotonic()
        back = kill()
        try:
            _wait("every pod Running", self.all_running, 180.0, 0.02)
            t_up = time.monotonic()
            r.all_running = True
            r.kill_to_running_s = t_up - t_kill
            r.back_to_running_s = t_up - back if back is not None else 0.0
            with contextlib.suppress(TimeoutError):  # a sync may still be removing a dead
                _wait("one sandbox per pod", lambda: all(  # sandbox of its pod
                    v == 1 for v in self._sandbox_counts().values()), 30.0, 0.05)
            self.tally(r)
        except TimeoutError as err:
            r.error = str(err)
            self.tally(r)
        for name in self.tags:
            (self.manifests / f"{name}.yaml").unlink()
        try:
            _wait("the pods gone", self.gone, 180.0, 0.05)
        except TimeoutError as err:
            r.error = r.error or str(err)
        with contextlib.suppress(TimeoutError):
            _wait("their processes gone", lambda: not self.sleepers(), 10.0, 0.05)
        r.left_processes = sum(self.sleepers().values())
        try:
            r.left_sandboxes = sum(1 for s in self.cri.list_pod_sandbox() if self.ours(s.labels))
        except CriError:
            r.left_sandboxes = -1
        r.left_in_cgroups = in_cgroups(self.cgroup_root)
        with contextlib.suppress(TimeoutError):  # a shim exits a moment after its sandbox
            _wait("the shims gone", lambda: not self.shims(), 10.0, 0.05)
        shims = self.shims()
        r.left_shims = len(shims)
        for shim in shims:  # an idle shim holds no process; one that does is a leak of ours
            with contextlib.suppress(psutil.Error):
                r.left_in_cgroups.extend(f"{c.pid} {' '.join(c.cmdline())} (child of shim "
                                         f"{shim.pid})" for c in shim.children())
        return r

    def _sandbox_counts(self) -> Counter[str]:
        out: Counter[str] = Counter()
        try:
            for s in self.cri.list_pod_sandbox():
                if (pod := self.ours(s.labels)) is not None:
                    out[pod] += 1
        except CriError:
            pass
        return Counter({pod: out.get(pod, 0) for pod in self.tags})

    def close(self) -> None:
        self.stop_agent()
        self.cri.close()


def _remove_cgroup(root: str) -> None:
    from tests.support import containerd as ctrd  # type: ignore[import-not-found]
    ctrd.remove_pod_cgroup(root)


def measure(rounds: int, pods: int, after: int, kill: str) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="pvbk", dir="/tmp"))
    private: Private | None = None
    out: dict[str, Any] = {"kill": kill, "pods": pods, "after": after}
    bench: Bench | None = None
    try:
        private = Private(tmp / "ctrd")
        t0 = time.monotonic()
        try:
            private.setup_and_start()
        except RuntimeError as err:
            return {"error": f"containerd unavailable: {err}"}
        out["private_setup_start_s"] = round(time.monotonic() - t0, 2)
        bench = Bench(tmp, private.endpoint, pods, after, private.shims)
        ctrd = private
        bench.start_agent()

        def kill_it() -> float | None:
            if kill == "none":
                return None
            if kill == "syncloop":
                bench.kill_syncloop()
                return None
            ctrd.kill9()
            ctrd.start()
            return time.monotonic()

        results = []
        for i in range(rounds):
            r = bench.round(i, kill_it)
            results.append(r)
            print(_row(i, r, kill), flush=True)
        out["rounds"] = [asdict(r) for r in results]
        ups = [r.kill_to_running_s for r in results if r.all_running]
        if ups:
            out["kill_to_running_p50_s"] = statistics.median(ups)
            out["kill_to_running_max_s"] = max(ups)
        backs = [r.back_to_running_s for r in results if r.all_running and kill == "containerd"]
        if backs:
            out["back_to_running_p50_s"] = statistics.median(backs)
            out["back_to_running_max_s"] = max(backs)
        out["clean_rounds"] = sum(1 for r in results if _clean(r, pods))
    finally:
        if bench is not None:
            bench.close()
        if private is not None:
            private.stop()
        if bench is not None:
            _remove_cgroup(bench.cgroup_root)
        if os.environ.get("PVBENCH_KEEP"):
            print(f"(kept {tmp})")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _clean(r: Round, pods: int) -> bool:
    one = {1: pods}
    return (r.all_running and not r.error and r.processes == one and r.tasks == one
            and r.ready == one and r.sandboxes == one and r.restarted == 0
            and r.left_processes == 0 and r.left_sandboxes == 0 and not r.left_in_cgroups)


def _dist(d: dict[int, int]) -> str:
    """{count per pod: pods} as "1x40" or "1x38 2x2"."""
    return " ".join(f"{k}x{v}" for k, v in sorted(d.items())) or "-"


def _row(i: int, r: Round, kill: str) -> str:
    up = f"{r.kill_to_running_s:6.2f} s" if r.all_running else "     - "
    back = f" (back+{r.back_to_running_s:5.2f} s)" if kill == "containerd" and r.all_running \
        else ""
    line = (f"  round {i + 1:2d}: running at kill {r.running_at_kill:2d}  all Running "
            f"{'yes' if r.all_running else 'NO '} {up}{back}  processes/pod {_dist(r.processes)}"
            f"  sandboxes/pod {_dist(r.sandboxes)} (ready {_dist(r.ready)})  tasks/pod "
            f"{_dist(r.tasks)}  containers/pod {_dist(r.containers)}  restarted {r.restarted}"
            f"  left after removal: processes {r.left_processes} sandboxes {r.left_sandboxes}"
            f" in their cgroups {len(r.left_in_cgroups)} (containerd's idle shims "
            f"{r.left_shims})")
    return line + (f"  ERROR {r.error}" if r.error else "") + "".join(
        f"\n      not running: {d}" for d in r.dead) + "".join(
        f"\n      left in the pods' cgroups: {p}" for p in r.left_in_cgroups)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--pods", type=int, default=40, help="pods dropped at once per round")
    ap.add_argument("--after", type=int, default=5, help="kill once this many containers run")
    ap.add_argument("--kill", choices=("syncloop", "containerd", "none"), default="syncloop",
                    help="none: the same rounds without a kill (the burst's own pace)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    load = os.getloadavg()
    if not args.json:
        what = (f"kill -9 of {args.kill} once {args.after} run" if args.kill != "none"
                else f"no kill (times from when {args.after} run)")
        print(f"{args.rounds} rounds of {args.pods} pods at once on containerd, {what} "
              f"(load {load[0]:.2f}, shared machine):")
    figures = measure(args.rounds, args.pods, args.after, args.kill)
    figures["load"] = [round(x, 2) for x in load]
    if args.json:
        print(json.dumps(figures, sort_keys=True))
    elif "error" in figures:
        print(f"containerd: {figures['error']}")
    else:
        if "private_setup_start_s" in figures:
            print(f"  private containerd: setup + start {figures['private_setup_start_s']} s")
        if "kill_to_running_p50_s" in figures:
            print(f"  kill -> all {args.pods} Running: p50 {figures['kill_to_running_p50_s']:.2f}"
                  f" s, max {figures['kill_to_running_max_s']:.2f} s")
        if "back_to_running_p50_s" in figures:
            print(f"  containerd answering again -> all Running: p50 "
                  f"{figures['back_to_running_p50_s']:.2f} s, max "
                  f"{figures['back_to_running_max_s']:.2f} s")
        print(f"  clean rounds (all Running, 1 process, 1 sandbox, 1 task per pod, no restart, "
              f"nothing left): {figures['clean_rounds']}/{args.rounds}")
    return 1 if "error" in figures or figures.get("clean_rounds") != args.rounds else 0


if __name__ == "__main__":
    sys.exit(main())
