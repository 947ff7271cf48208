"""What resource limits and a security context add to a container start: embedded runtime
and containerd, same run.

For each runtime, N containers of each kind, in rotation so that load drifts hit all alike:
no resources; a memory limit only; memory + CPU shares + CPU quota (what the sync loop sends
for a Guaranteed pod); a security context only (non-root user, groups, capabilities dropped
but one, no_new_privs, the kubelet's default masked and read-only paths); and both together,
the figure issue 17 sets a target for (< 2 ms added per container on the embedded runtime).
Each figure is CreateContainer + StartContainer returned (the container running; its sandbox
made beforehand, not counted), then RemoveContainer. With limits, the embedded runtime makes
the container's cgroup (v1: memory and cpuacct, plus cpu and pids when limited) and writes the
limits at create, its process joins them before exec, and the folders go at remove; with a
security context the monitor's child makes a private mount namespace, mounts the masks, and
changes its ids and capabilities before exec. "memory only" is the cost of the cgroup
mechanism; with CPU limits the container's process also competes with the host's other tasks
as one cgroup of 512 shares while it execs, which on a loaded machine shows as a longer start
(the scheduler, not podvisor's work). Prints figures, asserts nothing. Root and mounted
cgroup controllers are needed for the limits.

    .venv/bin/python bench/limits.py [-n 40] [--no-containerd]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from cri_api.v1 import api_pb2 as pb

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from tests.support.containerd import remove_pod_cgroup  # noqa: E402

GUARANTEED = pb.LinuxContainerResources(memory_limit_in_bytes=256 * 1024 * 1024,
                                        cpu_shares=512, cpu_period=100_000, cpu_quota=50_000)
# name -> (resources, security context): the security context is bench/runtime.py's (a
# non-root user and group, a supplemental group, capabilities dropped but one, no_new_privs,
# the kubelet's default masked and read-only paths)
KINDS: dict[str, tuple[pb.LinuxContainerResources | None, bool]] = {
    "plain": (None, False),
    "memory limit": (pb.LinuxContainerResources(memory_limit_in_bytes=256 * 1024 * 1024),
                     False),
    "memory+cpu": (GUARANTEED, False),
    "security ctx": (None, True),
    "limits+security": (GUARANTEED, True),
}


def _runtime_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pv_bench_runtime", HERE / "runtime.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rb = _runtime_bench()


def measure(t: rb.Target, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for i in range(len(KINDS) * n):
        kind, (res, secure) = list(KINDS.items())[i % len(KINDS)]
        sandbox = t.sandbox()
        start = time.perf_counter()
        cid = t.container(sandbox, "main", secure, resources=res)
        out.setdefault(f"start {kind}", []).append(time.perf_counter() - start)
        t.client.stop_container(cid, 0)
        start = time.perf_counter()
        t.client.remove_container(cid)
        out.setdefault(f"remove {kind}", []).append(time.perf_counter() - start)
    t.clean()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=40, help="containers of each kind")
    parser.add_argument("--no-containerd", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="pvblim", dir="/tmp"))
    proc, client = rb.start_embedded(base)
    parent = f"/podvisor-bench-{os.getpid()}"
    emb = rb.Target("embedded", client, "host", parent, remove_pod_cgroup)
    ctr = "skipped (--no-containerd)" if args.no_containerd else rb.containerd_target()
    results = {}
    try:
        results["embedded"] = measure(emb, args.n)
        if isinstance(ctr, rb.Target):
            results["containerd"] = measure(ctr, args.n)
    finally:
        emb.clean()
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        remove_pod_cgroup(parent)
        if isinstance(ctr, rb.Target):
            ctr.clean()
            shutil.rmtree(ctr.tmp, ignore_errors=True)
        shutil.rmtree(emb.tmp, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)

    print(f"\n{'':<12} {'':<24} {'p50':>9} {'p99':>9}   (ms, {args.n} containers each)")
    for name, r in results.items():
        for key in r:
            print(f"{name:<12} {key:<24} {rb.pct(r[key], .5) * 1e3:9.2f} "
                  f"{rb.pct(r[key], .99) * 1e3:9.2f}")
        for kind in list(KINDS)[1:]:
            added = (rb.pct(r[f"start {kind}"], .5) - rb.pct(r["start plain"], .5)) * 1e3
            # paired: each round starts one container of each kind back to back, so the
            # median of the per-round differences cancels most of a shared machine's drift
            paired = rb.pct([a - b for a, b in zip(r[f"start {kind}"], r["start plain"],
                                                   strict=True)], .5) * 1e3
            print(f"{name:<12} {'added by ' + kind:<24} {added:9.2f} {paired:9.2f}   "
                  "(p50 difference, median of paired differences)")
    if isinstance(ctr, str):
        print(f"\ncontainerd: {ctr}")
    print("target: limits and a security context together add < 2 ms per container start "
          "on the embedded runtime (the 'added by limits+security' row)")


if __name__ == "__main__":
    main()
