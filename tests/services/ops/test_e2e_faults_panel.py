"""The dashboard's faults panel (issue 28): its API on the ops port (GET/POST /api/faults, POST
/api/faults/clear, behind the port's HTTP Basic auth) and the panel itself in Debian's Chromium:
inject from the form, see it listed, clear it."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from podvisor.testing import Node, NodeOptions, wait_until
from tests.services.ops.webdriver import Browser

CHROMEDRIVER, CHROMIUM = shutil.which("chromedriver"), shutil.which("chromium")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def podvisor_node_options() -> NodeOptions:
    # a port chosen when the test starts (one chosen at import was taken by another server
    # by the time this test ran in the full suite)
    return NodeOptions(config={"opsPort": _free_port(), "opsAddress": "127.0.0.1"})


def _ops_port(node: Node) -> int:
    """The node's ops port, once it answers: the ops process is RUNNING before its web
    thread has bound the port."""
    port = int(node.options.config["opsPort"])

    def accepts() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0
    wait_until(accepts, 30, 0.05, f"the ops port {port} accepting")
    return port


def _password(node: Node) -> str:
    pw = node.paths.root / "ops-password"
    return wait_until(lambda: pw.exists() and pw.read_text().strip(), 20, 0.05, "ops-password")


def _api(node: Node, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    auth = base64.b64encode(f"admin:{_password(node)}".encode()).decode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{_ops_port(node)}{path}", method="GET" if body is None else "POST",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Basic {auth}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def test_the_faults_api_injects_lists_and_clears(podvisor_node: Node) -> None:
    node = podvisor_node
    status, fault = _api(node, "/api/faults", {"kind": "bus", "target": "pleg",
                                               "action": "delay", "delay": 0.1, "for": 60})
    assert status == 200 and fault["id"] == "f1" and fault["spec"]["action"] == "delay"
    status, listed = _api(node, "/api/faults")
    assert status == 200 and [f["id"] for f in listed["faults"]] == ["f1"]
    status, bad = _api(node, "/api/faults", {"kind": "bus", "target": "nosuch"})
    assert status == 409 and "no process named 'nosuch'" in bad["faultString"]
    status, cleared = _api(node, "/api/faults/clear", {"id": "f1"})
    assert status == 200 and [f["id"] for f in cleared["cleared"]] == ["f1"]
    assert [e["involvedObject"]["name"] for e in node.events("FaultCleared")] == ["f1"]
    assert node.faults() == []


@pytest.fixture
def browser(podvisor_node: Node) -> Iterator[Browser]:
    if not (CHROMEDRIVER and CHROMIUM):
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/test-packages.txt)")
    b = Browser(CHROMEDRIVER, CHROMIUM)
    try:
        b.get(f"http://admin:{_password(podvisor_node)}@127.0.0.1:{_ops_port(podvisor_node)}/")
        yield b
    finally:
        b.close()


def test_the_panel_injects_and_clears_a_fault(podvisor_node: Node, browser: Browser) -> None:
    b = browser
    wait_until(lambda: b.find("#faultform"), 30, 0.1, "the faults panel")
    b.script("""const f = document.getElementById('faultform');
        f.kind.value = 'stop'; f.target.value = 'imagegc'; f.for.value = '120';
        f.requestSubmit();""")
    wait_until(lambda: "stop imagegc" in (b.text("#faultlist tbody") or ""), 30, 0.1,
               "the fault listed on the page")
    [fault] = podvisor_node.faults()
    assert (fault.spec.kind, fault.spec.target, fault.spec.duration) == ("stop", "imagegc", 120)
    wait_until(lambda: b.click("#faultlist tbody button"), 10, 0.1, "click clear")
    wait_until(lambda: not podvisor_node.faults(), 30, 0.1, "the fault cleared")
    wait_until(lambda: not (b.text("#faultlist tbody") or "").strip(), 30, 0.1,
               "the list empty on the page")
