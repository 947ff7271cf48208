"""PyPI's supervisorctl (its own virtualenv) drives a real agent over the ops port."""

from __future__ import annotations

import base64
import re
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.services.ops.opsagent import APP, OpsAgent, ops_agent
from tests.services.ops.peers import peer_bin

# One agent for the module (stopped by PID with its pods); restarts outlive single tests.
pytestmark = pytest.mark.no_leak_check


@pytest.fixture(scope="module")
def ops() -> Iterator[OpsAgent]:
    yield from ops_agent()


@pytest.fixture(scope="module")
def bindir() -> Path:
    return peer_bin()


def ctl(bindir: Path, ops: OpsAgent, *args: str,
        password: str | None = None) -> subprocess.CompletedProcess[str]:
    pw = ops.password if password is None else password
    return subprocess.run([str(bindir / "supervisorctl"), "-s", ops.url, "-u", "admin", "-p", pw,
                           *args], capture_output=True, text=True, timeout=120)


def test_status_lists_agent_and_containers(bindir: Path, ops: OpsAgent) -> None:
    out = ctl(bindir, ops, "status")
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    for name in ("agent:pleg", "agent:syncloop", "agent:ops", APP):
        assert name in lines, out.stdout + out.stderr
        assert "RUNNING" in lines[name] and "pid " in lines[name]


def test_restart_pleg_changes_pid(bindir: Path, ops: OpsAgent) -> None:
    before = ops.rpc().supervisor.getProcessInfo("agent:pleg")["pid"]
    out = ctl(bindir, ops, "restart", "agent:pleg")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "agent:pleg: stopped" in out.stdout and "agent:pleg: started" in out.stdout
    after = ops.rpc().supervisor.getProcessInfo("agent:pleg")
    assert after["statename"] == "RUNNING" and after["pid"] != before


def test_tail_syncloop(bindir: Path, ops: OpsAgent) -> None:
    out = ctl(bindir, ops, "tail", "agent:syncloop")
    assert out.returncode == 0, out.stderr
    assert '"syncloop"' in out.stdout


def test_stop_start_container(bindir: Path, ops: OpsAgent,
                              wait_for: Callable[..., Any]) -> None:
    out = ctl(bindir, ops, "stop", APP)
    assert f"{APP}: stopped" in out.stdout, out.stdout + out.stderr
    # restartPolicy Always: the kubelet restarts it; start waits for that (or finds it back)
    out = ctl(bindir, ops, "start", APP)
    assert (f"{APP}: started" in out.stdout
            or f"{APP}: ERROR (already started)" in out.stdout), out.stdout + out.stderr
    wait_for(lambda: "RUNNING" in ctl(bindir, ops, "status", APP).stdout, 60.0,
             message="container RUNNING again")


def test_wrong_password_refused(bindir: Path, ops: OpsAgent) -> None:
    out = ctl(bindir, ops, "status", password="wrong")
    assert out.returncode != 0
    assert "Server requires authentication" in out.stdout + out.stderr


class TailF:
    """A running ``supervisorctl tail -f``/``maintail -f`` writing to a file; stopped by PID
    (SIGINT: supervisorctl's Ctrl-C path, then kill if it lingers)."""

    def __init__(self, bindir: Path, ops: OpsAgent, out: Path, *args: str) -> None:
        self.out = out
        self._file = out.open("wb")
        self.proc = subprocess.Popen([str(bindir / "supervisorctl"), "-s", ops.url, "-u",
                                      "admin", "-p", ops.password, *args],
                                     stdout=self._file, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.out.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._file.close()


def _ticks(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"tick (\d+)", text)]


def test_tail_f_follows_a_container(bindir: Path, ops: OpsAgent, tmp_path: Path,
                                    wait_for: Callable[..., Any]) -> None:
    for channel in ((), ("stderr",)):
        tail = TailF(bindir, ops, tmp_path / f"tail{len(channel)}", "tail", "-f", APP, *channel)
        try:
            first = wait_for(lambda: _ticks(tail.text()), 30.0,  # noqa: B023
                             message="the log's last KiB")
            wait_for(lambda: max(_ticks(tail.text())) >= max(first) + 3, 30.0,  # noqa: B023
                     message="new lines followed")
            assert tail.proc.poll() is None, tail.text()  # still following
        finally:
            tail.stop()
        assert "==> Press Ctrl-C to exit <==" in tail.text()


def test_tail_f_subsystem_and_maintail_f(bindir: Path, ops: OpsAgent, tmp_path: Path,
                                         wait_for: Callable[..., Any]) -> None:
    tail = TailF(bindir, ops, tmp_path / "sync", "tail", "-f", "agent:syncloop")
    main = TailF(bindir, ops, tmp_path / "main", "maintail", "-f")
    try:
        wait_for(lambda: '"syncloop"' in tail.text(), 30.0, message="syncloop's log")
        wait_for(lambda: "supervisor" in main.text(), 30.0, message="the main log")
        pid = ops.rpc().supervisor.getProcessInfo("agent:pleg")["pid"]
        ops.rpc().supervisor.signalProcess("agent:pleg", "KILL")  # the supervisor logs it
        wait_for(lambda: str(pid) in main.text().partition("Ctrl-C")[2], 30.0,
                 message="the main log followed: the pleg's exit appended")
        assert tail.proc.poll() is None and main.proc.poll() is None
    finally:
        tail.stop()
        main.stop()


def test_logtail_http_errors(ops: OpsAgent) -> None:
    auth = "Basic " + base64.b64encode(f"admin:{ops.password}".encode()).decode()
    cases = [("/logtail/agent:nope", auth, 404), ("/logtail/nogroup:x", auth, 404),
             (f"/logtail/{APP}/stdin", auth, 404), (f"/logtail/{APP}", None, 401),
             ("/mainlogtail", None, 401)]
    for path, header, code in cases:
        req = urllib.request.Request(ops.url + path, headers={"Authorization": header}
                                     if header else {})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        assert err.value.code == code, path
    req = urllib.request.Request(ops.url + "/mainlogtail", method="POST", data=b"",
                                 headers={"Authorization": auth})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 400
