"""supervisord event listeners from superlance (PyPI, own venv) on a real agent:
``crashmail`` (PROCESS_STATE_EXITED, with a fake sendmail) reports a killed subsystem and a
killed container; ``memmon`` (TICK_5) is a real XML-RPC client of the ops port: it reads
``getAllProcessInfo`` and restarts ``agent:prober`` over its memory limit, so its pid changes.
"""

from __future__ import annotations

import shlex
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ops.opsagent import APP, OpsAgent, ops_agent
from tests.ops.peers import peer_bin

# One agent for the module (stopped by PID with its pods); restarts outlive single tests.
pytestmark = pytest.mark.no_leak_check


@pytest.fixture(scope="module")
def mails(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mails")


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
    }
    yield from ops_agent(supervision={"processes": processes})


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
