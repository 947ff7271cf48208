"""supervisord's XML-RPC at /RPC2 on a real agent, with the stdlib's XML-RPC client: codes,
fields, faults, auth, actions on subsystems and containers (docs/ARCHITECTURE.md, "The ops
port")."""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.error
import urllib.request
import xmlrpc.client
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN
from tests.services.ops.opsagent import APP, GROUP, OpsAgent, ops_agent
from tests.support.lifecycle import get_pods

# One agent for the module (stopped by PID, its pods with it: stopPodsOnExit); tests restart
# subsystems and containers of that agent, whose new processes outlive each single test.
pytestmark = pytest.mark.no_leak_check

INFO_KEYS = {"name", "group", "start", "stop", "now", "state", "statename", "spawnerr",
             "exitstatus", "logfile", "stdout_logfile", "stderr_logfile", "pid", "description"}


@pytest.fixture(scope="module")
def ops() -> Iterator[OpsAgent]:
    yield from ops_agent()


def test_identity_and_introspection(ops: OpsAgent) -> None:
    s = ops.rpc()
    assert s.supervisor.getAPIVersion() == "3.0"
    assert s.supervisor.getVersion() == "3.0"
    assert s.supervisor.getState() == {"statecode": 1, "statename": "RUNNING"}
    assert s.supervisor.getPID() == ops.handle.proc.pid
    methods = s.system.listMethods()
    for name in ("supervisor.getAllProcessInfo", "supervisor.tailProcessStdoutLog",
                 "system.multicall", "system.methodSignature"):
        assert name in methods
    assert s.system.methodSignature("supervisor.readLog") == [["string", "int", "int"]]
    assert "@param" in s.system.methodHelp("supervisor.getProcessInfo")
    calls = [{"methodName": "supervisor.getAPIVersion", "params": []},
             {"methodName": "supervisor.getProcessInfo", "params": ["agent:nope"]}]
    ok, fault = s.system.multicall(calls)
    assert ok == ["3.0"]
    assert fault["faultCode"] == 10 and fault["faultString"].startswith("BAD_NAME")


def test_process_info_fields_and_groups(ops: OpsAgent) -> None:
    infos = ops.rpc().supervisor.getAllProcessInfo()
    by_spec = {f"{i['group']}:{i['name']}": i for i in infos}
    assert {"agent:pleg", "agent:syncloop", "agent:ops", APP} <= set(by_spec)
    for info in infos:
        assert set(info) == INFO_KEYS
    pleg = by_spec["agent:pleg"]
    assert pleg["state"] == 20 and pleg["statename"] == "RUNNING" and pleg["pid"] > 0
    assert pleg["description"].startswith(f"pid {pleg['pid']}, uptime ")
    app = by_spec[APP]
    assert app["group"] == GROUP and app["state"] == 20 and app["pid"] > 0
    assert app["stdout_logfile"].endswith(".log")


def test_faults(ops: OpsAgent) -> None:
    s = ops.rpc()
    cases: list[tuple[Callable[[], Any], int]] = [
        (lambda: s.supervisor.getProcessInfo("agent:nope"), 10),
        (lambda: s.supervisor.getProcessInfo("nogroup:x"), 10),
        (lambda: s.supervisor.nosuchmethod(), 1),
        (lambda: s.supervisor.getProcessInfo(), 2),
        (lambda: s.supervisor.signalProcess("agent:pleg", "NOSUCHSIG"), 11),
        (lambda: s.supervisor.startProcess("agent:pleg"), 60),
        (lambda: s.supervisor.readProcessStdoutLog("agent:pleg", -10, 5), 3),
    ]
    for call, code in cases:
        with pytest.raises(xmlrpc.client.Fault) as err:
            call()
        assert err.value.faultCode == code, err.value.faultString


def test_unauthenticated_and_wrong_password_get_401(ops: OpsAgent) -> None:
    for path in ("/", "/RPC2", "/api/state", "/api/events", "/api/action", "/api/log",
                 "/static/app.js"):
        for method in ("GET", "POST"):
            req = urllib.request.Request(ops.url + path, method=method, data=b"" if
                                         method == "POST" else None)
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(req, timeout=10)
            assert err.value.code == 401
            assert err.value.headers["WWW-Authenticate"].startswith("Basic")
    with pytest.raises(xmlrpc.client.ProtocolError) as perr:
        ops.rpc(password="wrong").supervisor.getAPIVersion()
    assert perr.value.errcode == 401
    with pytest.raises(xmlrpc.client.ProtocolError):
        ops.rpc(user="root").supervisor.getAPIVersion()


def test_logs_read_and_tail(ops: OpsAgent, wait_for: Callable[..., Any]) -> None:
    s = ops.rpc()
    text = s.supervisor.readProcessStdoutLog("agent:syncloop", -2000, 0)
    assert '"subsystem"' in text or "syncloop" in text
    wait_for(lambda: len(s.supervisor.readProcessStdoutLog(APP, 0, 0)) > 200, 20.0,
             message="some container log")
    data, offset, overflow = s.supervisor.tailProcessStdoutLog(APP, 0, 100)
    assert offset > 100 and overflow is True and len(data) <= 100
    more = wait_for(lambda: s.supervisor.tailProcessStdoutLog(APP, offset, 4096)[0], 10.0,
                    message="new container log lines")
    assert "tick" in more
    assert "tick" in s.supervisor.readProcessStderrLog(APP, 0, 0)
    assert s.supervisor.readLog(0, 100)


def test_restart_subsystem_changes_pid(ops: OpsAgent) -> None:
    s = ops.rpc()
    before = s.supervisor.getProcessInfo("agent:pleg")["pid"]
    assert s.supervisor.stopProcess("agent:pleg") is True
    assert s.supervisor.getProcessInfo("agent:pleg")["statename"] == "STOPPED"
    assert s.supervisor.startProcess("agent:pleg") is True
    after = s.supervisor.getProcessInfo("agent:pleg")
    assert after["statename"] == "RUNNING" and after["pid"] not in (0, before)
    with pytest.raises(xmlrpc.client.Fault) as err:
        s.supervisor.stopProcess("agent:ops")
    assert err.value.faultCode == 30


def test_container_stop_signal_and_restart_policy(ops: OpsAgent,
                                                  wait_for: Callable[..., Any]) -> None:
    s = ops.rpc()
    first = s.supervisor.getProcessInfo(APP)
    restarts = _restarts(ops)
    assert s.supervisor.signalProcess(APP, "KILL") is True
    wait_for(lambda: _restarts(ops) > restarts, 60.0, message="restart count grows after KILL")
    # The kubelet's status (read-only port) and the ops port's replicas move separately: wait
    # for the ops port's own view of the NEW container, not for any RUNNING (the old one's
    # state may still be what its replicas hold).
    second = wait_for(lambda: _running_other_than(s, first["pid"]), 60.0,
                      message="restartPolicy Always brings it back (a new pid, RUNNING)")
    restarts = _restarts(ops)
    assert s.supervisor.stopProcess(APP) is True
    wait_for(lambda: _restarts(ops) > restarts, 60.0, message="stopped container restarted")
    wait_for(lambda: _running_other_than(s, second["pid"]), 60.0,
             message="the restarted container RUNNING over XML-RPC")
    with pytest.raises(xmlrpc.client.Fault) as err:
        s.supervisor.startProcess(APP)
    assert err.value.faultCode == 60


def _running_other_than(s: Any, pid: int) -> dict[str, Any] | None:
    info: dict[str, Any] = s.supervisor.getProcessInfo(APP)
    ok = info["statename"] == "RUNNING" and info["pid"] not in (0, pid)
    return info if ok else None


def _restarts(ops: OpsAgent) -> int:
    data = get_pods(int(ops.handle.config["readOnlyPort"])) or {"items": []}
    for item in data["items"]:
        for cs in item.get("status", {}).get("containerStatuses", []):
            if cs["name"] == "app":
                return int(cs.get("restartCount", 0))
    return -1


def test_ops_password_printed_by_podvisorctl(ops: OpsAgent) -> None:
    out = ops.handle.ctl("ops-password")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ops.password
    pw = ops.handle.paths.root / "ops-password"
    assert pw.stat().st_mode & 0o777 == 0o600


def _get(ops: OpsAgent, path: str, data: bytes | None = None) -> Any:
    req = urllib.request.Request(ops.url + path, data=data, headers={
        "Authorization": "Basic " + base64.b64encode(f"admin:{ops.password}".encode()).decode(),
        "Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=30)


def test_dashboard_api(ops: OpsAgent, wait_for: Callable[..., Any]) -> None:
    with _get(ops, "/") as resp:
        assert b'src="static/app.js"' in resp.read()  # relative: also under the fleet
    with _get(ops, "/static/app.js") as resp:
        assert b"EventSource" in resp.read()
    with _get(ops, "/api/state") as resp:
        state = json.loads(resp.read())
    names = {p["namespec"] for p in state["processes"]}
    assert {"agent:pleg", APP} <= names and state["pods"][0]["group"] == GROUP
    with _get(ops, "/api/events") as resp:  # server-sent events: the first state at once
        assert resp.readline() == b"retry: 1000\n" and resp.readline() == b"\n"
        assert resp.readline().strip() == b"event: state"
        assert json.loads(resp.readline().removeprefix(b"data: "))["processes"]
    pid = ops.rpc().supervisor.getProcessInfo("agent:pleg")["pid"]
    body = json.dumps({"action": "kill", "name": "agent:pleg", "signal": "KILL"}).encode()
    with _get(ops, "/api/action", body) as resp:
        assert json.loads(resp.read()) == {"ok": True}
    wait_for(lambda: ops.rpc().supervisor.getProcessInfo("agent:pleg")["pid"] not in (0, pid),
             30.0, message="pleg back with a new pid")
    with _get(ops, f"/api/log?name={APP}&offset=-1") as resp:
        log = json.loads(resp.read())
    assert "tick" in log["text"] and log["offset"] > 0
    with _get(ops, "/api/state") as resp:
        timeline = json.loads(resp.read())["timeline"]
    assert any(c["name"] == "agent:pleg" and c["restart"] for c in timeline)


def _ctl(ops: OpsAgent, creds: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "podvisorctl"), "--endpoint", ops.url, "--credentials",
                           str(creds), *args], capture_output=True, text=True, timeout=120)


def test_podvisorctl_over_the_ops_port(ops: OpsAgent, tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.write_text(f"admin:{ops.password}\n")
    out = _ctl(ops, creds, "status")
    assert out.returncode == 0, out.stderr
    assert "agent:pleg" in out.stdout and APP in out.stdout
    before = ops.rpc().supervisor.getProcessInfo("agent:pleg")["pid"]
    out = _ctl(ops, creds, "restart", "pleg")
    assert out.returncode == 0 and out.stdout.startswith("agent:pleg: RUNNING"), out.stderr
    assert ops.rpc().supervisor.getProcessInfo("agent:pleg")["pid"] != before
    out = _ctl(ops, creds, "tail", APP, "-n", "3")
    assert out.returncode == 0 and out.stdout.count("tick") == 3
    out = _ctl(ops, creds, "status", "nope", "--json")
    assert out.returncode == 1 and "BAD_NAME(10)" in out.stderr
    assert _ctl(ops, creds, "pods").returncode == 2
    creds.write_text("wrong\n")  # a bare password: user admin
    out = _ctl(ops, creds, "status")
    assert out.returncode == 2 and "wrong credentials" in out.stderr
