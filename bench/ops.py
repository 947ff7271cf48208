"""Ops port benchmark (not a test; prints figures): a real agent with P pods of 3 containers
each (`sleep`, embedded runtime) beside supervisord with the same number of programs.

1. `getAllProcessInfo` latency over XML-RPC (HTTP Basic on, as always), p50/p99 over R calls:
   podvisor (P*3 containers + the agent's subsystems) vs supervisord (P*3 programs, its own
   virtualenv, bench/supervisord_peer.py). Target: podvisor <= supervisord.
2. Dashboard: kill -9 of `pleg` (control endpoint) -> the first server-sent `state` event that
   shows pleg not RUNNING or with a new pid, read by a client subscribed to `/api/events` as the
   page is (the browser's render adds its own few ms). Target < 500 ms.
3. CPU (user + system seconds) of the `ops` process over W seconds with 5 idle dashboards
   subscribed, beside no dashboard, R rounds of both windows in turn: medians, each round and
   the load average printed. Target < 0.5 % of a core.

   With ``--fleet`` (the default; ``--no-fleet`` to leave it out), a ``podvisor fleet``
   follows the agent during the 5-dashboard windows too (the fleet feed on: one more
   subscriber of the node's feed, with its 2 s beat). The charts' sampling (every 5 s) runs
   in both windows: it is always on.

    .venv/bin/python bench/ops.py [--quick] [--pods 110] [--calls 50] [--idle-seconds 30]
                                  [--rounds 3] [--no-fleet] [--idle-only]

``--idle-only``: only item 3 (no supervisord, no kill rounds).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import xmlrpc.client
from pathlib import Path
from typing import Any

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from supervisord_peer import Supervisord

from podvisor.ipc.control import AgentNotRunning, ControlClient

BIN = Path(sys.executable).parent
POD = """apiVersion: v1
kind: Pod
metadata: {{name: p{i}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: a, image: host, imagePullPolicy: IfNotPresent, command: [sleep, "3600"]}}
  - {{name: b, image: host, imagePullPolicy: IfNotPresent, command: [sleep, "3600"]}}
  - {{name: c, image: host, imagePullPolicy: IfNotPresent, command: [sleep, "3600"]}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait(pred: Any, timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(interval)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class Agent:
    def __init__(self, pods: int) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="pvbops", dir="/tmp"))
        (self.tmp / "m").mkdir()
        for i in range(pods):
            (self.tmp / "m" / f"p{i}.yaml").write_text(POD.format(i=i), encoding="utf-8")
        self.port = free_port()
        cfg = {"rootDir": str(self.tmp / "root"), "nodeName": "bench", "opsPort": self.port,
               "staticPodPath": str(self.tmp / "m"), "stopPodsOnExit": True,
               "supervision": {"shutdownTimeout": "120s", "stopPodsTimeout": "120s"}}
        (self.tmp / "c.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
        self.log = (self.tmp / "agent.log").open("wb")
        self.proc = subprocess.Popen([str(BIN / "podvisor"), "run", "--config",
                                      str(self.tmp / "c.yaml")], stdout=self.log,
                                     stderr=self.log, stdin=subprocess.DEVNULL)
        self.control = ControlClient(f"ipc://{self.tmp}/root/run/control.sock", timeout=10)
        self.password = ""

    def start(self, containers: int) -> None:
        def up() -> bool:
            try:
                self.control.call("status", timeout=1.0)
                return True
            except AgentNotRunning:
                return False
        wait(up, 60, "agent up", 0.05)
        pw = self.tmp / "root" / "ops-password"
        self.password = wait(lambda: pw.exists() and pw.read_text().strip(), 30, "password")
        wait(lambda: self.running() >= containers, 600, "containers running", 1.0)

    def rpc(self) -> Any:
        return xmlrpc.client.ServerProxy(
            f"http://admin:{self.password}@127.0.0.1:{self.port}/RPC2")

    def running(self) -> int:
        try:
            infos = self.rpc().supervisor.getAllProcessInfo()
        except (OSError, xmlrpc.client.Error):
            return 0
        return sum(1 for i in infos if i["group"] != "agent" and i["statename"] == "RUNNING")

    def ops_pid(self) -> int:
        row = next(p for p in self.control.call("status")["processes"] if p["name"] == "ops")
        return int(row["pid"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(180)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def latency(call: Any, calls: int) -> tuple[float, float]:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), pct(times, 0.99)


class SSE:
    """A dashboard's subscription: reads `/api/events` on a thread, counts the `state` events
    (and the `ping` keep-alives apart) and hands each state to `on_state`."""

    def __init__(self, port: int, password: str, on_state: Any = None) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        auth = base64.b64encode(f"admin:{password}".encode()).decode()
        self.conn.request("GET", "/api/events", headers={"Authorization": f"Basic {auth}"})
        self.resp = self.conn.getresponse()
        self.on_state = on_state
        self.states = 0
        self.pings = 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        event = b""
        try:
            for line in self.resp:
                if line.startswith(b"event: "):
                    event = line[7:].strip()
                elif line.startswith(b"data: ") and event == b"ping":
                    self.pings += 1
                elif line.startswith(b"data: ") and event == b"state":
                    self.states += 1
                    if self.on_state is not None:
                        self.on_state(line[6:], time.monotonic())
        except (OSError, ValueError, AttributeError):  # closed by close()
            pass

    def close(self) -> None:
        self.conn.close()


def kill_to_page(agent: Agent, rounds: int) -> list[float]:
    import json

    out = []
    for _ in range(rounds):
        pid = next(p for p in agent.control.call("status")["processes"]
                   if p["name"] == "pleg")["pid"]
        seen: list[float] = []

        def on_state(data: bytes, t: float, pid: int = pid, seen: list[float] = seen) -> None:
            for p in json.loads(data)["processes"]:
                if p["namespec"] == "agent:pleg" and (p["statename"] != "RUNNING"
                                                      or p["pid"] != pid) and not seen:
                    seen.append(t)

        sse = SSE(agent.port, agent.password, on_state)
        wait(lambda s=sse: s.states > 0, 10, "first state", 0.01)
        t0 = time.monotonic()
        agent.control.call("kill", name="pleg", signal="KILL")
        wait(lambda s=seen: s, 10, "page shows the kill", 0.002)
        out.append((seen[0] - t0) * 1000)
        sse.close()
        wait(lambda: next(p for p in agent.control.call("status")["processes"]
                          if p["name"] == "pleg")["state"] == "RUNNING", 30, "pleg back")
    return out


def idle_cpu(pid: int, seconds: float) -> float:
    proc = psutil.Process(pid)
    t0, c0 = time.monotonic(), sum(proc.cpu_times()[:2])
    time.sleep(seconds)
    return (sum(proc.cpu_times()[:2]) - c0) / (time.monotonic() - t0) * 100


class Fleet:
    """``podvisor fleet`` over the agent (its own config and password under the agent's tmp)."""

    def __init__(self, agent: Agent) -> None:
        d = agent.tmp / "fleet"
        d.mkdir(exist_ok=True)
        (d / "node.cred").write_text(f"admin:{agent.password}\n")
        (d / "fleet.yaml").write_text(yaml.safe_dump({"port": free_port(), "nodes": [
            {"name": "bench", "url": f"http://127.0.0.1:{agent.port}",
             "credentialsFile": "node.cred"}]}))
        self.log = (d / "fleet.log").open("wb")
        self.proc = subprocess.Popen([str(BIN / "podvisor"), "fleet", "--config",
                                      str(d / "fleet.yaml")], stdout=self.log, stderr=self.log,
                                     stdin=subprocess.DEVNULL)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def subscribers(ops: int) -> int:
    """The ops process's established connections (the dashboards', the fleet's)."""
    return sum(1 for c in psutil.Process(ops).net_connections() if c.status == "ESTABLISHED")


def idle_rounds(agent: Agent, a: Any) -> None:
    ops = agent.ops_pid()
    time.sleep(5)  # pleg's last restart settles
    bases: list[float] = []
    fives: list[float] = []
    loads = [os.getloadavg()[0]]
    for _ in range(a.rounds):
        bases.append(idle_cpu(ops, a.idle_seconds))
        boards = [SSE(agent.port, agent.password) for _ in range(5)]
        wait(lambda bs=boards: all(b.states for b in bs), 10, "dashboards subscribed", 0.01)
        fleet = Fleet(agent) if a.fleet else None
        if fleet is not None:
            wait(lambda: subscribers(ops) >= 6, 20, "the fleet subscribed", 0.05)
            time.sleep(1)  # its first state sent
        fives.append(idle_cpu(ops, a.idle_seconds))
        if fleet is not None:
            fleet.close()
        for b in boards:
            b.close()
        loads.append(os.getloadavg()[0])
    each = ", ".join(f"{x:.2f}/{y:.2f}" for x, y in zip(bases, fives, strict=True))
    print(f"ops process CPU, {a.rounds} x {a.idle_seconds:g} s (load average "
          f"{min(loads):.1f}-{max(loads):.1f}): no dashboard "
          f"{statistics.median(bases):.2f} % of a core, 5 idle dashboards"
          f"{' + the fleet feed' if a.fleet else ''} "
          f"{statistics.median(fives):.2f} % (medians; target < 0.5 %; each round "
          f"none/five: {each})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--pods", type=int, default=110)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fleet", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--idle-only", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.pods, a.calls, a.idle_seconds, a.rounds = 20, 20, 5.0, 1
    n = a.pods * 3
    agent = Agent(a.pods)
    sd = Supervisord()
    try:
        agent.start(n)
        if a.idle_only:
            idle_rounds(agent, a)
            return
        sd.write_programs([f"p{i}" for i in range(n)])
        sd.start()
        sd.wait_rpc()
        sd.wait_all_running(n)
        rows = [("getAllProcessInfo", "p50 ms", "p99 ms", "processes")]
        ours = latency(lambda: agent.rpc().supervisor.getAllProcessInfo(), a.calls)
        theirs = latency(lambda: sd.rpc.supervisor.getAllProcessInfo(), a.calls)
        total = len(agent.rpc().supervisor.getAllProcessInfo())
        rows.append(("podvisor", f"{ours[0]:.1f}", f"{ours[1]:.1f}", str(total)))
        rows.append(("supervisord", f"{theirs[0]:.1f}", f"{theirs[1]:.1f}", str(n)))
        for r in rows:
            print(f"{r[0]:<20} {r[1]:>8} {r[2]:>8} {r[3]:>10}")
        print(f"ratio podvisor/supervisord p50: {ours[0] / theirs[0]:.2f} (target <= 1)")
        ktp = kill_to_page(agent, 3 if a.quick else 10)
        print(f"kill -9 pleg -> dashboard state shows it: p50 {statistics.median(ktp):.0f} ms, "
              f"max {max(ktp):.0f} ms (target < 500 ms)")
        idle_rounds(agent, a)
    finally:
        sd.stop()
        agent.stop()


if __name__ == "__main__":
    main()
