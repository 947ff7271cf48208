"""Restart latency of a supervised process (not a test; prints figures).

Runs `podvisor run` with one idle test service, then N times: SIGKILL the service and time
  - detect:  SIGKILL -> the supervisor publishes the crash (BACKOFF) on the bus,
  - restart: SIGKILL -> the supervisor publishes RUNNING, i.e. it got the new incarnation's
             first heartbeat (`ready`).
Times use CLOCK_MONOTONIC, which every process on the host shares (bus envelopes carry it).

    .venv/bin/python bench/restart.py [-n 50] [--module svc_idle] [--spawn-method exec]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
import zmq

from podvisor.ipc.bus import Subscriber
from podvisor.ipc.control import AgentNotRunning, ControlClient
from podvisor.ipc.messages import ProcessStateChanged
from podvisor.ipc.paths import RunPaths

REPO = Path(__file__).resolve().parent.parent
SERVICES = REPO / "tests" / "support" / "testservices"


def _wait_event(sub: Subscriber, name: str, to: str, timeout: float = 10.0) -> tuple[float, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        env = sub.recv(timeout=max(0.0, deadline - time.monotonic()))
        if env is None:
            break
        msg = env.message
        if isinstance(msg, ProcessStateChanged) and msg.name == name and msg.to_state == to:
            return env.ts, msg.pid or 0
    raise TimeoutError(f"no {to} event for {name}")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=50)
    ap.add_argument("--module", default="svc_idle")
    ap.add_argument("--spawn-method", default="forkserver", choices=("forkserver", "exec"))
    ap.add_argument("--json", action="store_true",
                    help="also print the samples as one JSON object on the last line")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pvb", dir="/tmp"))
    paths = RunPaths(tmp / "root")
    cfg = {"rootDir": str(paths.root), "supervision": {
        "builtins": False, "heartbeatInterval": "200ms", "logLevel": "warning",
        "spawnMethod": args.spawn_method,
        "processes": {"svc": {"module": args.module, "intensity": 100000,
                              "backoffResetAfter": "0"}}}}
    (tmp / "c.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(SERVICES)}
    bindir = Path(sys.executable).parent
    agent = subprocess.Popen([str(bindir / "podvisor"), "run", "--config", str(tmp / "c.yaml")],
                             env=env, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        client = ControlClient(paths.control)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.call("status", timeout=1.0)
                break
            except AgentNotRunning:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        sub = Subscriber(zctx, paths, ["supervisor.process.state"])
        detect: list[float] = []
        restart: list[float] = []
        for i in range(args.n + 1):
            row = client.call("status", name="svc")["processes"][0]
            while row["state"] != "RUNNING":
                time.sleep(0.01)
                row = client.call("status", name="svc")["processes"][0]
            while sub.recv(timeout=0.0) is not None:
                pass
            t0 = time.monotonic()
            os.kill(row["pid"], signal.SIGKILL)
            t_detect, _ = _wait_event(sub, "svc", "BACKOFF")
            t_up, _ = _wait_event(sub, "svc", "RUNNING")
            if i == 0:
                continue  # warm-up (the subscription may still be joining)
            detect.append((t_detect - t0) * 1000)
            restart.append((t_up - t0) * 1000)
        sub.close()
        print(f"restart latency over {len(restart)} SIGKILLs "
              f"(spawnMethod {args.spawn_method}, module {args.module})")
        for label, vals in (("detect death", detect), ("first heartbeat", restart)):
            print(f"  {label:16s} p50 {statistics.median(vals):7.1f} ms   "
                  f"p99 {_pct(vals, 0.99):7.1f} ms   max {max(vals):7.1f} ms")
        if args.json:
            print(json.dumps({"detect_ms": detect, "restart_ms": restart}))
        return 0
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
        zctx.destroy(linger=0)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
