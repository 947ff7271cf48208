"""`podvisorctl logs` and the sync loop's events with a real agent (embedded runtime): a pod
that echoes lines (one longer than a CRI record, so split into P records), `--tail`,
`--follow` across a container restart, clear errors for unknown pods and containers; and the
events of a crashing container (Started, ContainerDied, BackOff) and of a deleted pod
(Killing)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

BIN = Path(sys.executable).parent
LONG = 20000  # > the runtime's 16 KiB record limit

ECHO = """apiVersion: v1
kind: Pod
metadata:
  name: echo
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: host
    command: ["sh", "-c", "{script}"]
"""
SCRIPT = ("for i in 1 2 3 4 5; do echo line$i; done; echo oops >&2; "
          f"head -c {LONG} /dev/zero | tr '\\\\0' x; echo; exec sleep 3600")

TWO = """apiVersion: v1
kind: Pod
metadata:
  name: two
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - {name: a, image: host, command: ["sleep", "3600"]}
  - {name: b, image: host, command: ["sleep", "3600"]}
"""

CRASH = """apiVersion: v1
kind: Pod
metadata:
  name: crash
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: host
    command: ["sh", "-c", "echo run; exit 3"]
"""


def logs(handle: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return handle.ctl("logs", *args)


def events(handle: Any) -> list[dict[str, Any]]:
    out = handle.ctl("events", "--json")
    assert out.returncode == 0, out.stderr
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def has_event(handle: Any, pod: str, reason: str, word: str = "") -> bool:
    return any(e["involvedObject"].get("name") == pod and e["reason"] == reason
               and word in e["message"] for e in events(handle))


@pytest.mark.timeout(170)
def test_logs_tail_follow_and_events(agent: Any, wait_for: Any) -> None:
    manifests = Path(tempfile.mkdtemp(prefix="pvlog", dir="/tmp"))
    follower = None
    try:
        (manifests / "echo.yaml").write_text(ECHO.format(script=SCRIPT))
        (manifests / "two.yaml").write_text(TWO)
        (manifests / "crash.yaml").write_text(CRASH)
        handle = agent(config={
            "nodeName": "e2e", "port": 0, "staticPodPath": str(manifests), "stopPodsOnExit": True,
            "syncloop": {"crashLoopBackOffInitial": "1s", "crashLoopBackOffMax": "2s"},
            "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}})

        # the whole log: stdout and stderr, the long line joined from its P records
        out = wait_for(lambda: (r := logs(handle, "echo")).returncode == 0
                       and r.stdout.count("\n") >= 7 and r, 60.0, message="echo's log")
        lines = out.stdout.splitlines()
        assert lines[:5] == ["line1", "line2", "line3", "line4", "line5"]
        # stdout and stderr are two pipes: "oops" and the long stdout line written after it
        # are logged in the order the monitor read them, which a busy machine can swap
        last_two = sorted(["oops", "x" * LONG])
        assert sorted(lines[5:7]) == last_two
        # name, namespace/name and the full static pod name all work; --tail N
        for pod in ("echo", "default/echo", "echo-e2e", "default/echo-e2e"):
            r = logs(handle, pod, "app", "--tail", "2")
            assert r.returncode == 0 and sorted(r.stdout.splitlines()) == last_two, pod
        assert logs(handle, "echo", "--tail", "0").stdout == ""

        # clear errors
        r = logs(handle, "nosuchpod")
        assert r.returncode == 1 and 'pod "nosuchpod" not found' in r.stderr
        r = logs(handle, "echo", "nosuch")
        assert r.returncode == 1 and 'container "nosuch" is not valid' in r.stderr
        r = wait_for(lambda: (r := logs(handle, "two")).returncode == 1
                     and "choose one of: [a b]" in r.stderr and r, 60.0)
        assert logs(handle, "two", "b").returncode == 0

        # --follow across restarts of the crashing container, until Ctrl-C
        follower = subprocess.Popen(
            [str(BIN / "podvisorctl"), "--root-dir", str(handle.paths.root), "logs", "crash",
             "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert follower.stdout is not None
        os.set_blocking(follower.stdout.fileno(), False)
        got = bytearray()

        def runs_seen() -> bool:
            got.extend(follower.stdout.read() or b"")  # type: ignore[union-attr]
            return got.decode().splitlines().count("run") >= 3
        assert wait_for(runs_seen, 90.0, message="3 runs through one --follow")
        assert follower.poll() is None
        follower.send_signal(signal.SIGINT)
        assert follower.wait(10) == 0
        restarts = sorted(p.name for p in handle.paths.pod_logs_dir.glob("*_crash-e2e_*/app/*"))
        assert len(restarts) >= 3, restarts

        # the sync loop's and PLEG's events for it
        wait_for(lambda: has_event(handle, "crash-e2e", "BackOff", "Back-off restarting failed "
                                   "container app") and has_event(handle, "crash-e2e", "Started")
                 and has_event(handle, "crash-e2e", "ContainerDied", "exited with code 3"),
                 30.0, message="crash events")
        died = next(e for e in events(handle) if e["reason"] == "ContainerDied"
                    and e["involvedObject"].get("name") == "crash-e2e")
        assert died["type"] == "Warning" and died["involvedObject"]["fieldPath"] == \
            "spec.containers{app}"
        started = next(e for e in events(handle) if e["reason"] == "Started"
                       and e["involvedObject"].get("name") == "crash-e2e")
        assert started["count"] >= 2 and started["involvedObject"]["file"].endswith("crash.yaml")

        # deleting a manifest: Killing
        (manifests / "two.yaml").unlink()
        wait_for(lambda: has_event(handle, "two-e2e", "Killing", "Stopping container a"), 30.0)
        assert handle.ctl("events", "--pod", "two-e2e", "--limit", "1").returncode == 0
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.wait()
        shutil.rmtree(manifests, ignore_errors=True)
