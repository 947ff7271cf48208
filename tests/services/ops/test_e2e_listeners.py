"""supervisord event listeners from superlance (PyPI, own venv) on a real agent:
``crashmail`` (PROCESS_STATE_EXITED, with a fake sendmail) reports a killed subsystem and a
killed container; ``memmon`` (TICK_5) is a real XML-RPC client of the ops port: it reads
``getAllProcessInfo`` and restarts ``agent:prober`` over its memory limit, so its pid changes.
``loglisten`` (tests/services/ops/log_listener.py, supervisor's ``childutils``) subscribes to
PROCESS_LOG: the pod is annotated for stdout and stderr events, ``pleg`` has
``stdoutEventsEnabled``, nothing else does.
"""

from __future__ import annotations

import json
import shlex
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.services.ops.opsagent import APP, GROUP, OpsAgent, ops_agent
from tests.services.ops.peers import peer_bin

# One agent for the module (stopped by PID with its pods); restarts outlive single tests.
pytestmark = pytest.mark.no_leak_check


@pytest.fixture(scope="module")
def mails(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mails")


# the pod writes on both streams and asks for PROCESS_LOG_STDOUT/STDERR events (logevents.py)
WEB = """apiVersion: v1
kind: Pod
metadata:
  name: web
  annotations:
    ops.podvisor.io/stdout-events-enabled: "true"
    ops.podvisor.io/stderr-events-enabled: "true"
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: host
    command:
    - sh
    - -c
    - i=0; while true; do i=$((i+1)); echo tick $i; echo warn $i >&2; sleep 0.2; done
"""
LISTENER = Path(__file__).with_name("log_listener.py")


@pytest.fixture(scope="module")
def ops(mails: Path) -> Iterator[OpsAgent]:
    bindir = peer_bin()
    sendmail = mails / "sendmail"
    sendmail.write_text(f'#!/bin/sh\ncat > "{mails}/mail.$$.tmp" && '
                        f'mv "{mails}/mail.$$.tmp" "{mails}/mail.$$"\n', encoding="utf-8")
    sendmail.chmod(sendmail.stat().st_mode | stat.S_IEXEC)
    crashmail = (f"{bindir}/crashmail -a -m ops@example.com -o podvisor: "
                 f"-s {shlex.quote(str(sendmail))}")
    processes = {
        "crashmail": {"kind": "eventlistener", "command": crashmail,
                      "events": "PROCESS_STATE_EXITED"},
        # by bare name: superlance 2.0.0's memmon fails (KeyError) on a group:name -p
        "memmon": {"kind": "eventlistener", "command": f"{bindir}/memmon -p prober=1KB",
                   "events": "TICK_5"},
        "loglisten": {"kind": "eventlistener", "events": "PROCESS_LOG",
                      "command": f"{bindir}/python {LISTENER} {mails}/log-events.jsonl"},
        "pleg": {"stdoutEventsEnabled": True},
    }
    yield from ops_agent(web_yaml=WEB, supervision={"processes": processes})


def _mail_with(mails: Path, *words: str) -> str | None:
    for path in sorted(mails.glob("mail.*[0-9]")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if all(w in text for w in words):
            return text
    return None


def test_crashmail_reports_a_killed_subsystem(ops: OpsAgent, mails: Path,
                                              wait_for: Callable[..., Any]) -> None:
    assert ops.handle.wait_state("crashmail", "RUNNING")
    pid = ops.rpc().supervisor.getProcessInfo("agent:pleg")["pid"]
    ops.handle.call("kill", name="pleg", signal="KILL")
    text = wait_for(lambda: _mail_with(mails, "pleg", "agent", "exited unexpectedly",
                                       f"pid {pid}"), 30.0, message="crashmail's mail")
    assert "To: ops@example.com" in text and "from state RUNNING" in text


def test_crashmail_reports_a_killed_container(ops: OpsAgent, mails: Path,
                                              wait_for: Callable[..., Any]) -> None:
    ops.rpc().supervisor.signalProcess(APP, "KILL")
    group, name = APP.split(":")
    log = ops.handle.paths.logs_dir / "crashmail.listener.log"
    wait_for(lambda: _mail_with(mails, f"Process {name} in group {group} exited unexpectedly"),
             60.0, message=f"crashmail's mail about the container; its log: {log.read_text()}")


def test_memmon_restarts_prober_over_xmlrpc(ops: OpsAgent,
                                            wait_for: Callable[..., Any]) -> None:
    first = ops.rpc().supervisor.getProcessInfo("agent:prober")["pid"]
    wait_for(lambda: ops.rpc().supervisor.getProcessInfo("agent:prober")["pid"] not in
             (0, first), 30.0, message="memmon restarted agent:prober")


def _log_events(mails: Path) -> list[dict[str, Any]]:
    path = mails / "log-events.jsonl"
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def _find(mails: Path, eventname: str, name: str, needle: str,
          with_pid: bool = False) -> dict[str, Any] | None:
    for ev in _log_events(mails):
        if (ev["eventname"] == eventname and ev["headers"]["processname"] == name
                and needle in ev["data"] and (not with_pid or int(ev["headers"]["pid"]) > 0)):
            return ev
    return None


def test_process_log_events_of_a_container_and_a_subsystem(
        ops: OpsAgent, mails: Path, wait_for: Callable[..., Any]) -> None:
    assert ops.handle.wait_state("loglisten", "RUNNING")
    group, name = APP.split(":")
    # (the lines a container writes before the embedded runtime recorded its pid, which the
    # ops process reads, carry pid 0: the first event with the pid)
    out = wait_for(lambda: _find(mails, "PROCESS_LOG_STDOUT", name, "tick ", with_pid=True), 60.0,
                   message="a PROCESS_LOG_STDOUT event of the container, with its pid")
    assert out["headers"]["groupname"] == group == GROUP
    assert out["headers"]["channel"] == "stdout" and int(out["headers"]["pid"]) > 0
    assert set(out["headers"]) == {"processname", "groupname", "pid", "channel"}
    assert out["data"].endswith("\n") and "warn" not in out["data"]  # the text, not CRI lines
    err = wait_for(lambda: _find(mails, "PROCESS_LOG_STDERR", name, "warn "), 30.0,
                   message="a PROCESS_LOG_STDERR event of the container")
    assert err["headers"]["channel"] == "stderr" and "tick" not in err["data"]
    # pleg (stdoutEventsEnabled): a restart makes it log under its new pid
    ops.rpc().supervisor.stopProcess("agent:pleg")
    ops.rpc().supervisor.startProcess("agent:pleg")
    pid = str(ops.rpc().supervisor.getProcessInfo("agent:pleg")["pid"])
    ev = wait_for(lambda: next((e for e in _log_events(mails)
                                if e["headers"]["processname"] == "pleg"
                                and e["headers"]["pid"] == pid), None), 30.0,
                  message="a PROCESS_LOG_STDOUT event of agent:pleg under its new pid")
    assert ev["eventname"] == "PROCESS_LOG_STDOUT" and ev["headers"]["groupname"] == "agent"
    assert '"pleg"' in ev["data"]
    names = {e["headers"]["processname"] for e in _log_events(mails)}
    assert names == {name, "pleg"}, names  # off by default for every other process
