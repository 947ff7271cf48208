"""podvisorctl and the control endpoint against a real agent."""

from __future__ import annotations

import fcntl
import json
import signal
import socket
import subprocess
import time
from typing import Any

import msgpack
import psutil
import zmq

from podvisor.ipc.control import ControlClient, ControlFault, Fault
from tests.conftest import BIN

IDLE = {"module": "svc_idle", "heartbeatTimeout": "3s", "stopTimeout": "2s"}


def test_ctl_commands(agent: Any) -> None:
    a = agent({"web": IDLE, "db": IDLE})
    a.wait_state("web", "RUNNING")
    a.wait_state("db", "RUNNING")
    out = a.ctl("status")
    assert out.returncode == 0
    assert out.stdout.splitlines()[0].split() == ["NAME", "STATE", "PID", "RESTARTS", "UPTIME",
                                                  "LAST", "EXIT"]
    assert "web" in out.stdout and "RUNNING" in out.stdout

    out = a.ctl("stop", "web")
    assert out.returncode == 0 and "web: STOPPED" in out.stdout
    out = a.ctl("stop", "web")
    assert out.returncode == 1 and "NOT_RUNNING(70)" in out.stderr
    out = a.ctl("start", "web", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["state"] == "RUNNING"
    out = a.ctl("start", "web")
    assert out.returncode == 1 and "ALREADY_STARTED(60)" in out.stderr

    old = a.state("db")["pid"]
    out = a.ctl("restart", "db", "--json")
    assert out.returncode == 0
    row = json.loads(out.stdout)
    assert row["state"] == "RUNNING" and row["pid"] != old

    pid = a.state("web")["pid"]
    out = a.ctl("kill", "web", "--signal", "TERM")
    assert out.returncode == 0
    a.wait_state("web", "RUNNING", where=lambda r: r["pid"] != pid)

    out = a.ctl("tail", "web", "-n", "2")
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 2
    assert all(json.loads(line)["subsystem"] == "web" for line in out.stdout.splitlines())
    out = a.ctl("tail", "supervisor", "-n", "1")
    assert out.returncode == 0 and json.loads(out.stdout)["subsystem"] == "supervisor"


def test_ctl_faults(agent: Any) -> None:
    a = agent({"web": IDLE})
    a.wait_state("web", "RUNNING")
    cases = [
        (("status", "nope"), "BAD_NAME(10)"),
        (("start", "nope"), "BAD_NAME(10)"),
        (("kill", "web", "--signal", "SIGBOGUS"), "BAD_SIGNAL(11)"),
        (("kill", "web", "--signal", "999"), "BAD_SIGNAL(11)"),
        (("tail", "nope"), "BAD_NAME(10)"),
        (("events", "--limit", "-1"), "BAD_ARGUMENTS(3)"),
        # graceful node shutdown is off (no shutdownGracePeriod): said, and nothing stops
        (("shutdown", "--node"), "NOT_AVAILABLE(110): graceful node shutdown is off"),
    ]
    for args, fault in cases:
        out = a.ctl(*args)
        assert out.returncode == 1, (args, out)
        assert fault in out.stderr, (args, out.stderr)
    client = ControlClient(a.paths.control)
    try:
        client.call("frobnicate")
    except ControlFault as exc:
        assert exc.fault == Fault.UNKNOWN_METHOD
    else:
        raise AssertionError("expected a fault")
    for bad in ({"command": "kill", "args": {"name": 5}},
                {"command": "tail", "args": {"name": "web", "lines": "x"}},
                {"command": "shutdown", "args": {"node": "yes"}},
                {"command": "shutdown", "args": {"node": True, "pods": True}}):
        try:
            client.call(bad["command"], **bad["args"])  # type: ignore[arg-type]
        except ControlFault as exc:
            assert exc.fault == Fault.BAD_ARGUMENTS
    # garbage on the wire does not hurt the agent
    zctx = zmq.Context.instance()
    s = zctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(a.paths.control)
    for junk in (b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"command": 7})):
        s.send(junk)
        assert s.poll(5000)
        reply = msgpack.unpackb(s.recv())
        assert reply["fault"]["name"] == "INCORRECT_PARAMETERS"
    s.close()
    assert a.state("web")["state"] == "RUNNING"


def test_ctl_shutdown(agent: Any) -> None:
    a = agent({"web": IDLE})
    pid = a.wait_state("web", "RUNNING")["pid"]
    out = a.ctl("shutdown")
    assert out.returncode == 0
    assert a.proc.wait(30) == 0
    assert not psutil.pid_exists(pid)
    out = a.ctl("status")
    assert out.returncode == 2 and "not running" in out.stderr


def test_ctl_agent_not_running_is_fast(agent: Any) -> None:
    a = agent({"web": IDLE}, wait=False)
    a.stop()
    started = time.monotonic()
    out = a.ctl("status")
    assert out.returncode == 2 and "not running" in out.stderr
    # a stale socket (agent killed -9) is refused at once, not waited on
    stale = a.paths.run_dir / "control.sock"
    a.paths.run_dir.mkdir(parents=True, exist_ok=True)
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(stale))
    srv.close()
    out = a.ctl("--timeout", "60", "status")
    assert out.returncode == 2 and "stale" in out.stderr
    assert time.monotonic() - started < 30  # no hang (generous bound, not a timing test)


def test_sigint_to_agent_also_stops_cleanly(agent: Any) -> None:
    a = agent({"web": IDLE})
    a.wait_state("web", "RUNNING")
    a.proc.send_signal(signal.SIGINT)
    assert a.proc.wait(30) == 0


def test_shutdown_pods_waits_for_the_sync_loop(agent: Any) -> None:
    a = agent({"syncloop": {**IDLE, "module": "svc_fake_syncloop"}, "web": IDLE})
    a.wait_state("syncloop", "RUNNING")
    a.wait_state("web", "RUNNING")
    out = a.ctl("shutdown", "--pods")
    assert out.returncode == 0
    assert a.proc.wait(60) == 0
    events = [json.loads(x)["event"] for x in
              (a.paths.logs_dir / "supervisor.log").read_text().splitlines()]
    assert events.index("agent.pods_stopped") < events.index("process.stopping")
    assert "fake.stopall" in (a.paths.logs_dir / "syncloop.log").read_text()


def test_shutdown_pods_without_an_agent(agent: Any, tmp_path: Any) -> None:
    """No agent: `shutdown --pods` stops the pods itself
    (tests/supervisor/test_e2e_lifecycle_restart.py runs it with real pods); with no runtime state
    there is nothing to stop (exit 0); no rootDir is exit 2; an agent that holds the rootDir but
    does not answer is never bypassed (exit 2)."""
    a = agent({"web": IDLE})
    a.wait_state("web", "RUNNING")
    assert a.stop() == 0
    out = a.ctl("shutdown", "--pods")
    assert out.returncode == 0 and "no pods" in out.stdout, out
    out = a.ctl("shutdown")  # without --pods it only stops an agent
    assert out.returncode == 2 and "not running" in out.stderr
    missing = subprocess.run([str(BIN / "podvisorctl"), "--root-dir", str(tmp_path / "none"),
                              "shutdown", "--pods"], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no podvisor rootDir" in missing.stderr
    with (a.paths.run_dir / "agent.lock").open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a silent agent, as far as ctl knows
        out = a.ctl("shutdown", "--pods")
    assert out.returncode == 2 and "holds the rootDir" in out.stderr, out
