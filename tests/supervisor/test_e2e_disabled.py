"""A built-in the config leaves nothing to do is not spawned (issue 23): with ``readOnlyPort: 0``
and ``port: 0`` there is no ``server`` process, with ``opsPort: 0`` no ``ops``: not in ``status``,
``podvisorctl status``, XML-RPC or the dashboard; a SIGHUP reload that gives them a port starts
them, one that takes it away stops them and they are gone again."""

from __future__ import annotations

import base64
import json
import signal
import urllib.error
import urllib.request
import xmlrpc.client
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.lifecycle import agent_config, free_port

WaitFor = Callable[..., Any]


def _rpc(port: int, password: str) -> Any:
    return xmlrpc.client.ServerProxy(f"http://admin:{password}@127.0.0.1:{port}/RPC2")


def _dashboard_names(port: int, password: str) -> set[str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/state")
    req.add_header("Authorization", "Basic " + base64.b64encode(
        f"admin:{password}".encode()).decode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        return {p["namespec"] for p in json.loads(resp.read())["processes"]}


def _statename(rpc: Any, name: str) -> str:
    try:
        return str(rpc.supervisor.getProcessInfo(name)["statename"])
    except xmlrpc.client.Fault:
        return ""


def _healthz(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _reload(a: Any, cfg: dict[str, Any]) -> None:
    a.write_config(cfg)
    a.proc.send_signal(signal.SIGHUP)


def test_disabled_server_and_ops_are_not_spawned_and_reload_starts_and_stops_them(
        agent: Any, tmp_path: Path, wait_for: WaitFor) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    ops_port = free_port()
    cfg = agent_config(manifests, 0, opsPort=ops_port)  # readOnlyPort 0, port 0
    a = agent(config=cfg)
    a.wait_state("ops", "RUNNING", timeout=60.0)
    a.wait_state("syncloop", "RUNNING", timeout=60.0)
    assert "server" not in a.status()
    out = a.ctl("status", "--json")
    assert out.returncode == 0, out.stderr
    assert "server" not in {row["name"] for row in json.loads(out.stdout)["processes"]}
    password = (a.paths.root / "ops-password").read_text().strip()
    rpc = _rpc(ops_port, password)
    names = {f"{i['group']}:{i['name']}" for i in rpc.supervisor.getAllProcessInfo()}
    assert "agent:syncloop" in names and "agent:server" not in names
    with pytest.raises(xmlrpc.client.Fault) as err:
        rpc.supervisor.getProcessInfo("agent:server")
    assert err.value.faultCode == 10  # BAD_NAME
    assert "agent:server" not in _dashboard_names(ops_port, password)

    port = free_port()
    _reload(a, {**cfg, "readOnlyPort": port})
    a.wait_state("server", "RUNNING", timeout=60.0)
    wait_for(lambda: _healthz(port), 30.0, message="the read-only port after the reload")
    wait_for(lambda: _statename(rpc, "agent:server") == "RUNNING", 30.0,
             message="agent:server over XML-RPC")
    assert "agent:server" in _dashboard_names(ops_port, password)
    server, ops = a.state("server")["pid"], a.state("ops")["pid"]

    _reload(a, {**cfg, "readOnlyPort": 0, "opsPort": 0})
    wait_for(lambda: not {"server", "ops"} & set(a.status()), 60.0,
             message="server and ops stopped and gone")
    assert "syncloop" in a.status()
    wait_for(lambda: not _healthz(port), 30.0, message="the read-only port closed")
    for pid in (server, ops):
        wait_for(lambda pid=pid: not Path(f"/proc/{pid}").exists(), 30.0,
                 message=f"process {pid} gone")


def test_a_reload_that_turns_the_ops_port_on_writes_its_password_first(
        agent: Any, tmp_path: Path, wait_for: WaitFor) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    cfg = agent_config(manifests, 0)  # no port at all: neither server nor ops
    a = agent(config=cfg)
    a.wait_state("syncloop", "RUNNING", timeout=60.0)
    assert not {"server", "ops"} & set(a.status())
    password_file = a.paths.root / "ops-password"
    assert not password_file.exists()
    ops_port = free_port()
    _reload(a, {**cfg, "opsPort": ops_port})
    a.wait_state("ops", "RUNNING", timeout=60.0)
    password = password_file.read_text().strip()

    def answers() -> bool:
        try:
            return bool(_rpc(ops_port, password).supervisor.getState()["statename"] == "RUNNING")
        except (OSError, xmlrpc.client.Error):
            return False
    wait_for(answers, 30.0, message="XML-RPC on the ops port turned on by the reload")
