"""The fleet (``podvisor fleet --config FLEET.yaml``) over three real agents: its XML-RPC (the
fleet's own ``supervisor.*``/``fleet.*`` and each node's ``/RPC2`` through the fleet), and its
page in Debian's Chromium: all three nodes up, a restart issued from the page reaching the
right node, the drill-down to a node's own page, a hung node (its ``ops`` stopped with
SIGSTOP) and a stopped agent each shown down within 5 s. Screenshots go to
``$PODVISOR_ARTIFACTS/ops/`` (``fleet.png``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import xmlrpc.client
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.conftest import BIN, wait_for_impl
from tests.services.ops.opsagent import GROUP, OpsAgent, ops_agent
from tests.services.ops.test_e2e_browser import ARTIFACTS, CHROMEDRIVER, CHROMIUM
from tests.services.ops.webdriver import Browser
from tests.support.lifecycle import free_port

pytestmark = [pytest.mark.no_leak_check]  # three agents, a fleet, a browser: stopped by PID
NAMES = ("n1", "n2", "n3")
needs_browser = pytest.mark.skipif(
    not (CHROMEDRIVER and CHROMIUM),
    reason="needs Debian's chromium and chromium-driver (.ci/test-packages.txt)")


@contextmanager
def _agent() -> Iterator[OpsAgent]:
    gen = ops_agent()
    try:
        yield next(gen)
    finally:
        gen.close()


class FleetProc:
    def __init__(self, nodes: dict[str, OpsAgent]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pvfleet", dir="/tmp"))
        for name, node in nodes.items():
            (self.dir / f"{name}.cred").write_text(f"admin:{node.password}\n")
        self.port = free_port()
        cfg = {"port": self.port, "nodes": [
            {"name": n, "url": node.url, "credentialsFile": f"{n}.cred"}
            for n, node in nodes.items()]}
        (self.dir / "fleet.yaml").write_text(yaml.safe_dump(cfg))
        self.log = (self.dir / "fleet.log").open("wb")
        self.proc = subprocess.Popen([str(BIN / "podvisor"), "fleet", "--config",
                                      str(self.dir / "fleet.yaml")], stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=self.log)
        pw = self.dir / "fleet-password"
        self.password = wait_for_impl(lambda: pw.exists() and pw.read_text().strip(), 20.0,
                                      0.02, "the fleet's password file")
        wait_for_impl(self._answers, 20.0, 0.05, "the fleet answering")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"fleet exited {self.proc.returncode}: "
                                 f"{(self.dir / 'fleet.log').read_text()}")
        try:
            return requests.get(f"{self.url}/api/fleet", auth=("admin", self.password),
                                timeout=2).ok
        except requests.RequestException:
            return False

    def rpc(self, path: str = "/RPC2") -> Any:
        return xmlrpc.client.ServerProxy(
            f"http://admin:{self.password}@127.0.0.1:{self.port}{path}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def nodes() -> Iterator[dict[str, OpsAgent]]:
    with ExitStack() as stack:
        yield {name: stack.enter_context(_agent()) for name in NAMES}


@pytest.fixture(scope="module")
def fleet(nodes: dict[str, OpsAgent]) -> Iterator[FleetProc]:
    f = FleetProc(nodes)
    try:
        yield f
    finally:
        f.close()


def _all_up(fleet: FleetProc) -> bool:
    info = fleet.rpc().fleet.getAllNodeInfo()
    return [n["name"] for n in info if n["reachable"]] == list(NAMES)


def test_fleet_xmlrpc(nodes: dict[str, OpsAgent], fleet: FleetProc,
                      wait_for: Callable[..., Any]) -> None:
    wait_for(lambda: _all_up(fleet), 30.0, message="all three nodes reachable over fleet.*")
    # one supervisord over the fleet: groups NODE/GROUP
    def listed() -> set[str]:
        return {f"{p['group']}:{p['name']}" for p in fleet.rpc().supervisor.getAllProcessInfo()}
    names = wait_for(lambda: (got := listed()) >= {f"{n}/agent:pleg" for n in NAMES} and got,
                     30.0, message="every node's processes on the fleet's /RPC2")
    assert {f"{n}/{GROUP}:app" for n in NAMES} <= names
    own = nodes["n2"].rpc().supervisor.getProcessInfo("agent:pleg")
    via = fleet.rpc().supervisor.getProcessInfo("n2/agent:pleg")
    assert via["pid"] == own["pid"] and via["group"] == "n2/agent"
    with pytest.raises(xmlrpc.client.Fault) as bad:
        fleet.rpc().supervisor.getProcessInfo("nx/agent:pleg")
    assert bad.value.faultCode == 10  # BAD_NAME
    # a script over several supervisord URLs, unchanged: each node's /RPC2 through the fleet
    for name in NAMES:
        infos = fleet.rpc(f"/nodes/{name}/RPC2").supervisor.getAllProcessInfo()
        pids = {p["name"]: p["pid"] for p in infos if p["group"] == "agent"}
        direct = {p["name"]: p["pid"] for p in nodes[name].rpc().supervisor.getAllProcessInfo()
                  if p["group"] == "agent"}
        assert pids["pleg"] == direct["pleg"] and pids.keys() == direct.keys()
    rows = fleet.rpc().fleet.getAllProcessInfo()
    assert {r["node"] for r in rows} == set(NAMES)


@needs_browser
def test_fleet_page(nodes: dict[str, OpsAgent], fleet: FleetProc,
                    wait_for: Callable[..., Any]) -> None:
    assert CHROMEDRIVER and CHROMIUM
    with ExitStack() as stack:
        b = Browser(CHROMEDRIVER, CHROMIUM)
        stack.callback(b.close)
        base = f"http://admin:{fleet.password}@127.0.0.1:{fleet.port}"
        b.get(f"{base}/")

        def state(name: str) -> str | None:
            return b.text(f'[data-node="{name}"] .nodestate')

        wait_for(lambda: all(state(n) == "UP" for n in NAMES), 30.0,
                 message="the three nodes UP on the fleet page")
        wait_for(lambda: b.text('[data-node="n1"] [data-phase="Running"]'), 30.0,
                 message="n1's pods by phase")
        wait_for(lambda: all(b.text(f'[data-usage="{n}/agent:pleg"]') not in (None, "-")
                             for n in NAMES), 30.0, message="the subsystems' usage")
        b.screenshot(ARTIFACTS / "fleet.png")

        # a restart from the fleet page reaches n2, and only n2
        pids = {n: nodes[n].handle.state("pleg")["pid"] for n in NAMES}
        css = 'button[data-node="n2"][data-action="restart"][data-name="agent:pleg"]'
        wait_for(lambda: b.click(css), 10.0, message="click restart of n2's pleg")
        wait_for(lambda: nodes["n2"].handle.state("pleg")["pid"] not in (None, pids["n2"]),
                 30.0, message="n2's pleg restarted")
        nodes["n2"].handle.wait_state("pleg", "RUNNING", 30.0)
        assert nodes["n1"].handle.state("pleg")["pid"] == pids["n1"]
        assert nodes["n3"].handle.state("pleg")["pid"] == pids["n3"]

        # a hung node (its ops process stopped): down once nothing came for the link's 5 s
        # (its reason says that bound: a deadline of 5 s here raced it, as the last frame may
        # have come just before the stop), up again once it goes on
        ops_pid = nodes["n1"].handle.state("ops")["pid"]
        os.kill(ops_pid, signal.SIGSTOP)
        try:
            wait_for(lambda: state("n1") == "DOWN", 30.0, message="the hung n1 DOWN")
            wait_for(lambda: "no answer within 5s" in (b.text('[data-node="n1"] .why') or ""),
                     30.0, message="n1's reason: no answer within the link's 5 s")
        finally:
            os.kill(ops_pid, signal.SIGCONT)
        wait_for(lambda: state("n1") == "UP", 30.0, message="n1 UP again")

        # an agent stopped: down (its connection closed: no timeout to wait out); the others
        # stay up (how soon: printed, measured, not asserted)
        stopped = time.monotonic()
        nodes["n3"].handle.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: state("n3") == "DOWN", 30.0, message="the stopped n3 DOWN")
        took = time.monotonic() - stopped
        assert state("n1") == "UP" and state("n2") == "UP"
        print(f"n3 shown down {took:.2f} s after its SIGTERM")
        nodes["n3"].handle.stop(60.0)
        b.screenshot(ARTIFACTS / "fleet-down.png")

        # drill-down: n1's own page through the fleet (the fleet adds n1's credentials)
        b.get(f"{base}/nodes/n1/")
        wait_for(lambda: "Running" in (b.text(f'[data-pod="{GROUP}"] h3') or ""), 30.0,
                 message="n1's own page through the fleet, live")
        wait_for(lambda: b.script(f"return Charts.latest()[{GROUP!r}] || null"), 30.0,
                 message="n1's charts through the fleet")
