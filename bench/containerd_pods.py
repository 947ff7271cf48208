"""Manifest -> Running in /pods on containerd (issue 16, item 3), not a test: prints figures.

A real `podvisor run` with `runtimeEndpoint` = containerd (the session's shared instance from
tests/support/containerd.py, e.g. PODVISOR_CONTAINERD_ENDPOINT=unix:///tmp/pvctr/run/
containerd.sock), hostNetwork pods of the test image (`sh -c 'sleep'`). containerd 1.6 has no
event stream, so PLEG relists: every 1 s, and at once on the sync loop's hint (RelistHint).
The time of a pod: from the manifest's rename into staticPodPath to its container running in
GET /pods (polled every 5 ms; the first pod is a warm-up). Then N manifests at once.
The kubelet 1.24 on the same containerd took 0.93-1.08 s for one pod (issue 16).

    .venv/bin/python bench/containerd_pods.py [-n 10] [--many 20] [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _pods(port: int) -> dict[str, Any] | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/pods")
        resp = conn.getresponse()
        body = resp.read()
        return json.loads(body) if resp.status == 200 else None
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()


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


def measure(n: int, many: int) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from tests.support import containerd as ctrd  # type: ignore[import-not-found]

    try:
        handle = ctrd.containerd_or_skip()
    except BaseException as err:  # pytest's skip outcome is a BaseException
        return {"error": f"containerd unavailable: {err}"}
    tmp = Path(tempfile.mkdtemp(prefix="pvbc", dir="/tmp"))
    manifests, staging = tmp / "manifests", tmp / "staging"
    manifests.mkdir()
    staging.mkdir()
    port = _port()
    cgroup_root = f"/podvisor-bench-{os.getpid()}"
    config = {"rootDir": str(tmp / "root"), "nodeName": "bench", "staticPodPath": str(manifests),
              "readOnlyPort": port, "stopPodsOnExit": True, "runtimeEndpoint": handle.endpoint,
              "cgroupRoot": cgroup_root, "supervision": {"shutdownTimeout": "120s"}}
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
        doc = _pods(port)
        return doc is not None and not doc.get("items")

    out: dict[str, Any] = {}
    try:
        _wait("the agent's /pods", lambda: _pods(port) is not None, 60.0, 0.05)
        singles = []
        for i in range(n + 1):
            path = stage(f"one{i}")
            t0 = time.monotonic()
            path.rename(manifests / path.name)
            _wait(f"one{i} running", lambda i=i: f"one{i}" in _running(_pods(port)), 60.0,
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
        _wait(f"{many} running", lambda: len(_running(_pods(port))) >= many, 300.0, 0.02)
        out["many_s"], out["many"] = time.monotonic() - t0, many
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
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=10, help="single pods, one at a time")
    ap.add_argument("--many", type=int, default=20, help="pods dropped at once")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    load = os.getloadavg()
    figures = measure(args.n, args.many)
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
