"""API server membership figures (issue 15): a real `podvisor run` agent (embedded runtime)
joined to the stand-in API server of the tests (tests/support/kubeapi, HTTPS + client certificate).

Prints:
- pod created in the API -> Running in the API's status (phase Running, every container
  running): p50/p99 over `--single` pods created one after another (then deleted), and the time
  for `--burst` pods created at once;
- API requests per minute at steady state with `--steady` pods (110 = maxPods) over `--window`
  seconds, by kind, beside the kubelet's budget (Node status every 10 s when changed / 5 min,
  Lease every 10 s: ~6-12 a minute, plus watch renewals every 5-10 min).

Defaults keep the kubelet's periods (statusSweepFrequency 10s, nodeLeaseRenewInterval 10s,
nodeStatusUpdateFrequency 10s), so the steady-state rate is what a real node would cost.
Run: `.venv/bin/python bench/api.py [--single 20 --burst 100 --steady 110 --window 60]`.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.kubeapi import ApiError, KubeApi  # noqa: E402

NODE = "bench-api"
BIN = Path(sys.executable).parent


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "nodeName": NODE, "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "app", "image": "host", "command": ["sleep", "3600"]}]}}


def running(api: KubeApi, name: str) -> bool:
    try:
        st = api.store.get("pods", "default", name).get("status", {})
    except ApiError:
        return False
    cs = st.get("containerStatuses") or []
    return st.get("phase") == "Running" and bool(cs) and all("running" in c["state"]
                                                             for c in cs)


def wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.005)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--single", type=int, default=20)
    ap.add_argument("--burst", type=int, default=100)
    ap.add_argument("--steady", type=int, default=110)
    ap.add_argument("--window", type=float, default=60.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pvapi"))
    api = KubeApi(tmp / "kubeapi")
    api.start()
    config = {"nodeName": NODE, "rootDir": str(tmp / "root"), "stopPodsOnExit": True,
              "kubeconfig": str(api.kubeconfig(tmp / "kubeconfig", user=f"system:node:{NODE}",
                                               groups=("system:nodes",)))}
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    log = (tmp / "agent.log").open("wb")
    proc = subprocess.Popen([str(BIN / "podvisor"), "run", "--config", str(tmp / "config.yaml")],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=str(tmp))
    try:
        started = time.monotonic()
        wait(lambda: _ready(api), 60, "the Node Ready")
        print(f"Node Ready {time.monotonic() - started:.2f}s after start")
        single = []
        for i in range(args.single):
            name = f"one-{i}"
            t0 = time.monotonic()
            api.store.create("pods", "default", pod(name))
            wait(lambda n=name: running(api, n), 60, name)
            single.append(time.monotonic() - t0)
        print(f"1 pod created -> Running in the API ({args.single} pods one after another): "
              f"p50 {statistics.median(single) * 1000:.0f} ms, p99 {pct(single, 99) * 1000:.0f} ms"
              f" (Kubernetes' pod startup SLO: p99 <= 5 s)")
        # the one-by-one pods leave (grace 0), so the burst and the steady set fit in maxPods
        for i in range(args.single):
            api.store.delete("pods", "default", f"one-{i}", grace=0)
        t0 = time.monotonic()
        names = [f"burst-{i}" for i in range(args.burst)]
        for name in names:
            api.store.create("pods", "default", pod(name))
        wait(lambda: all(running(api, n) for n in names), 300, "the burst")
        print(f"{args.burst} pods created at once -> all Running in the API: "
              f"{time.monotonic() - t0:.2f} s")
        total = args.burst
        for i in range(max(0, args.steady - total)):
            api.store.create("pods", "default", pod(f"fill-{i}"))
        extra = [f"fill-{i}" for i in range(max(0, args.steady - total))]
        wait(lambda: all(running(api, n) for n in extra), 300, "the fill")
        time.sleep(15)  # let the last writes of the startup settle before measuring
        mark = len(api.requests)
        t0 = time.monotonic()
        time.sleep(args.window)
        window = api.requests[mark:]
        minutes = (time.monotonic() - t0) / 60
        kinds = collections.Counter(f"{r.method} {_kind(r.path)}" for r in window)
        print(f"steady state with {max(args.steady, total)} pods: "
              f"{len(window) / minutes:.1f} API requests/minute")
        for kind, n in kinds.most_common():
            print(f"  {kind}: {n / minutes:.1f}/min")
        print("  kubelet budget: Lease 6/min + Node status <= 6/min + watch renewals")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        api.stop()
        log.close()
        if os.environ.get("KEEP") != "1":
            shutil.rmtree(tmp, ignore_errors=True)


def _ready(api: KubeApi) -> bool:
    try:
        node = api.store.get("nodes", "", NODE)
    except ApiError:
        return False
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in node.get("status", {}).get("conditions", []))


def _kind(path: str) -> str:
    parts = path.split("/")
    if "leases" in parts:
        return "lease"
    if "nodes" in parts:
        return "node status" if parts[-1] == "status" else "node"
    if parts[-1] == "status":
        return "pod status"
    return "pods (list/watch/other)"


if __name__ == "__main__":
    main()
