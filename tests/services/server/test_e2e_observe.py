"""End to end, one real agent (embedded runtime, static pods, main port with a token file):

- ``/metrics`` shows the pod workers' and the bus's metrics with plausible values after pods
  ran, a container restarted and a static pod was wanted again (same UID) while it terminated:
  ``kubelet_pod_worker_duration_seconds{operation_type}``, ``kubelet_pod_start_duration_seconds``,
  ``kubelet_restarted_pods_total{static}``, ``podvisor_bus_messages_total``,
  ``podvisor_bus_dropped_total{reason}``; ``promtool check metrics`` passes.
- kill -9 of the server (the process serving the main port) while ``podvisorctl logs --follow``,
  a ``/containerLogs?follow=true`` stream and an ``/exec`` are open: the port answers again (the
  time is printed: ``main port back ...``; only a generous functional deadline is asserted), the
  agent's other processes and the pods are untouched; ``podvisorctl logs --follow`` reads the CRI
  log files itself and goes on printing without a gap; the HTTP stream ends with the process (an
  incomplete chunked body) and a client resumes it with ``sinceTime`` = the last timestamp it
  printed, without a gap; the exec stream ends and its command is killed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from tests.conftest import AgentHandle, process_gone, short_tmp_dir, wait_for_impl
from tests.support.lifecycle import agent_config, free_port, get_pods, kill_pids, pod_yaml, read_pid

# The module's agent restarts its server (kill -9) and containers on purpose while tests run:
# the per-test leak check is replaced by one check after the agent stops.
pytestmark = pytest.mark.no_leak_check

TOKEN = "observe-token"
TALKER = ("echo $$$$ > {marks}/talker.pid; seq 1 1000000 | while read n; do echo line $n; "
          "sleep 0.05; done")
CRASH_ONCE = ("echo run $$$$; test -e {marks}/crashed && exec sleep 3600; "
              "touch {marks}/crashed; exit 1")
# ignores TERM (noting it) until the grace ends: its termination stays in flight for seconds
STUBBORN = "trap 'touch {marks}/again.term' TERM; while :; do sleep 1 & wait; done"
AGAIN_GRACE = 8


@dataclass
class Node:
    handle: AgentHandle
    port: int
    ro_port: int
    ca: str
    marks: Path
    manifests: Path
    parked: Path

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def get(self, path: str, **kw: Any) -> requests.Response:
        return requests.get(self.url(path), headers={"Authorization": f"Bearer {TOKEN}"},
                            verify=self.ca, timeout=10, **kw)

    def metric(self, series: str) -> float | None:
        for line in self.get("/metrics").text.splitlines():
            if line.startswith(series + " "):
                return float(line.rsplit(" ", 1)[1])
        return None


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    tmp = Path(tempfile.mkdtemp(prefix="pvobs", dir="/tmp"))
    home = short_tmp_dir()
    manifests, marks, parked = tmp / "manifests", tmp / "marks", tmp / "parked"
    for d in (manifests, marks, parked):
        d.mkdir()
    (manifests / "talker.yaml").write_text(pod_yaml("talker", TALKER.format(marks=marks)))
    (manifests / "crasher.yaml").write_text(pod_yaml("crasher", CRASH_ONCE.format(marks=marks)))
    (manifests / "again.yaml").write_text(pod_yaml("again", STUBBORN.format(marks=marks),
                                                   grace=AGAIN_GRACE))
    (tmp / "tokens.csv").write_text(f"{TOKEN},ops,1001\n", "utf-8")
    port, ro_port = free_port(), free_port()
    cfg = agent_config(manifests, ro_port, stopPodsOnExit=True,
                       authentication={"tokenFile": str(tmp / "tokens.csv")},
                       syncloop={"crashLoopBackOffInitial": "1s"})
    cfg["rootDir"], cfg["port"] = str(home / "root"), port
    handle = AgentHandle(home, cfg, [], dict(os.environ))
    n = Node(handle, port, ro_port, str(home / "root" / "pki" / "kubelet.crt"), marks,
             manifests, parked)
    try:
        handle.wait_ready()
        wait_for_impl(lambda: _running(n, {"talker-e2e", "again-e2e"}), 90.0, 0.1,
                      "talker and again running")
        wait_for_impl(lambda: _answers(n), 30.0, 0.1, "main port up")
        yield n
    finally:
        pids = [p for p in (read_pid(marks, "talker"),) if p]
        handle.stop()
        kill_pids(pids)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
        left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        _, alive = psutil.wait_procs(left, timeout=10.0)
        alive = [p for p in alive if not process_gone(p)]
        for proc in alive:
            proc.kill()
        assert not alive, f"the agent left processes behind: {alive}"


def _pods(n: Node) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in (get_pods(n.ro_port) or {}).get("items", [])}


def _running(n: Node, names: set[str]) -> bool:
    pods = _pods(n)
    return all(name in pods and pods[name]["status"].get("phase") == "Running"
               and all("running" in c.get("state", {})
                       for c in pods[name]["status"].get("containerStatuses", [{}]))
               for name in names)


def _restarts(n: Node, name: str) -> int:
    statuses = _pods(n).get(name, {}).get("status", {}).get("containerStatuses", [])
    return int(statuses[0]["restartCount"]) if statuses else -1


def _answers(n: Node) -> bool:
    try:
        return n.get("/healthz").status_code in (200, 500)
    except requests.RequestException:
        return False


def test_pod_worker_pod_start_restart_and_bus_metrics(node: Node, wait_for: Any) -> None:
    # a container restarts (a sync of its pod), a static pod is wanted again under the same
    # UID while it terminates (a restarted pod: its worker starts over with a create)
    wait_for(lambda: _restarts(node, "crasher-e2e") >= 1, 60.0, 0.2, "crasher restarted")
    uid = _pods(node)["again-e2e"]["metadata"]["uid"]
    (node.manifests / "again.yaml").rename(node.parked / "again.yaml")
    wait_for(lambda: (node.marks / "again.term").exists(), 30.0, 0.05, "again terminating")
    (node.parked / "again.yaml").rename(node.manifests / "again.yaml")
    wait_for(lambda: node.metric('kubelet_restarted_pods_total{static="true"}') == 1,
             AGAIN_GRACE + 30.0, 0.2, "the restart of again in /metrics")
    wait_for(lambda: _running(node, {"again-e2e"}), 60.0, 0.2, "again running again")
    assert _pods(node)["again-e2e"]["metadata"]["uid"] == uid
    assert node.metric('kubelet_restarted_pods_total{static=""}') == 0

    def worker(op: str, suffix: str = "_count") -> float:
        return node.metric(
            f'kubelet_pod_worker_duration_seconds{suffix}{{operation_type="{op}"}}') or 0.0

    # three pods, plus again's second life: four creates; syncs (crasher's restart,
    # PLEG events); again's termination a kill that took its grace. Three pod starts: again's
    # second life kept its status (its desired entry never left), so it is not timed again
    assert worker("create") >= 4 and worker("sync") >= 1 and worker("kill") >= 1
    assert worker("kill", "_sum") >= AGAIN_GRACE - 1
    assert 0 < worker("create", "_sum") / worker("create") < 60
    starts = wait_for(lambda: (v := node.metric("kubelet_pod_start_duration_seconds_count"))
                      and v >= 3 and v, 30.0, 0.2, "pod starts timed")
    took = node.metric("kubelet_pod_start_duration_seconds_sum") or 0.0
    assert 0 < took / starts < 60
    text = node.get("/metrics").text
    assert 'kubelet_pod_start_duration_seconds_bucket{le="0.5"}' in text
    assert 'kubelet_pod_worker_duration_seconds_bucket{le="0.005",operation_type="sync"}' \
        in text
    messages = node.metric("podvisor_bus_messages_total")
    assert messages is not None and messages > 100
    for reason in ("malformed", "hwm", "fields"):
        assert node.metric(f'podvisor_bus_dropped_total{{reason="{reason}"}}') == 0
    later = wait_for(lambda: (v := node.metric("podvisor_bus_messages_total")) and v > messages
                     and v, 30.0, 0.2, "the bus counter grows")
    assert later > messages
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    done = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


class _Lines:
    """A subprocess's stdout lines, read by a thread (the test never blocks on the pipe)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.lines: list[bytes] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip(b"\n"))

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(30)
        self._thread.join(10)
        return code


def _numbers(lines: list[bytes]) -> list[int]:
    """The talker's line numbers (``line N``, after a timestamp or not)."""
    return [int(ln.rsplit(b" ", 1)[1]) for ln in lines
            if ln.startswith(b"line ") or b" line " in ln]


def test_kill9_of_the_server_during_logs_follow_and_exec(node: Node, wait_for: Any) -> None:
    """One kill -9 of the server with three streams open through (or beside) it."""
    import aiohttp

    handle = node.handle
    wait_for(lambda: _answers(node), 30.0, 0.1, "main port up")
    talker_pid = read_pid(node.marks, "talker")
    restarts = {name: _restarts(node, name) for name in ("talker-e2e", "crasher-e2e")}
    others = {name: row["pid"] for name, row in handle.status().items() if name != "server"}
    old = handle.state("server")
    # 1. podvisorctl logs --follow (reads the CRI log files itself)
    ctl = subprocess.Popen(
        [str(Path(sys.executable).parent / "podvisorctl"), "--root-dir",
         str(handle.paths.root), "logs", "--follow", "--tail", "1", "talker"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    follower = _Lines(ctl)
    # 2. /containerLogs?follow=true with timestamps, over the main port
    stream = node.get("/containerLogs/default/talker-e2e/c",
                      params={"follow": "true", "tailLines": "1", "timestamps": "true"},
                      stream=True)
    assert stream.status_code == 200
    http_lines = stream.iter_lines()
    seen_http = [next(http_lines), next(http_lines)]
    wait_for(lambda: len(follower.lines) >= 2, 30.0, 0.05, "podvisorctl logs --follow prints")
    # 3. an exec whose command runs until the stream goes
    ctx = ssl.create_default_context(cafile=node.ca)
    query = "command=sh&command=-c&command=echo%20%24%24%3B%20exec%20sleep%201000&stdout=1"
    back: dict[str, float] = {}

    async def exec_and_kill() -> tuple[int, aiohttp.WSMsgType]:
        async with aiohttp.ClientSession() as session, session.ws_connect(
                node.url(f"/exec/default/talker-e2e/c?{query}"),
                protocols=("v5.channel.k8s.io",), ssl=ctx,
                headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            first = await ws.receive()
            pid = int(first.data[1:])
            handle.call("kill", name="server", signal="KILL")
            back["killed"] = time.monotonic()
            last = await ws.receive()
            while last.type is aiohttp.WSMsgType.BINARY:  # nothing more should come
                last = await ws.receive()
            return pid, last.type

    exec_pid, end = asyncio.run(exec_and_kill())
    wait_for(lambda: _answers(node), 30.0, 0.01, "main port back after kill -9")
    recovery = time.monotonic() - back["killed"]
    print(f"\nmain port back {recovery:.3f}s after kill -9 of the server "
          f"(load average {os.getloadavg()[0]:.2f})")
    assert handle.state("server")["pid"] != old["pid"]
    # the exec stream ended with its process; the runtime killed the command
    assert end in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.ERROR)
    wait_for(lambda: not psutil.pid_exists(exec_pid)
             or psutil.Process(exec_pid).status() == "zombie", 30.0, 0.05,
             "the exec'd command killed once its stream is gone")
    # the HTTP follow stream ended with the process: resume from the last timestamp seen
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        for line in http_lines:
            seen_http.append(line)
    last_stamp = seen_http[-1].split(b" ", 1)[0].decode()
    resumed = node.get("/containerLogs/default/talker-e2e/c",
                       params={"follow": "true", "sinceTime": last_stamp}, stream=True)
    assert resumed.status_code == 200
    again = resumed.iter_lines()
    more = [next(again) for _ in range(3)]
    resumed.close()
    [before_n], after_n = _numbers(seen_http[-1:]), _numbers(more)
    assert after_n[0] <= before_n + 1, (seen_http[-1], more)  # no gap (the last may repeat)
    assert after_n == list(range(after_n[0], after_n[0] + 3))
    # podvisorctl logs --follow never noticed: it goes on, line after line
    count = len(follower.lines)
    wait_for(lambda: len(follower.lines) >= count + 3, 30.0, 0.05, "logs --follow goes on")
    assert follower.stop() == 0
    numbers = _numbers(follower.lines)
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), "a gap in the follow"
    # the agent and the pods are untouched
    assert read_pid(node.marks, "talker") == talker_pid
    assert {name: _restarts(node, name) for name in restarts} == restarts
    now = {name: row["pid"] for name, row in handle.status().items() if name != "server"}
    assert now == others
    assert handle.state("server")["state"] == "RUNNING"
