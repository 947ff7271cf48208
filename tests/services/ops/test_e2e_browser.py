"""The dashboard in Debian's Chromium (headless, driven over WebDriver by chromedriver): log in,
see the pod, restart pleg and see its pid change without reloading, kill the container and see
its restart count grow, see a stopped subsystem's heartbeat go late and come back, follow a
log. Screenshots go to ``$PODVISOR_ARTIFACTS/ops/`` (default
``.artifacts/`` in the repository)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.services.ops.opsagent import APP, GROUP, OpsAgent, ops_agent
from tests.services.ops.webdriver import Browser

REPO = Path(__file__).resolve().parents[3]
ARTIFACTS = Path(os.environ.get("PODVISOR_ARTIFACTS", REPO / ".artifacts")) / "ops"
CHROMEDRIVER, CHROMIUM = shutil.which("chromedriver"), shutil.which("chromium")

pytestmark = [
    pytest.mark.no_leak_check,  # one agent and one browser for the module, stopped by PID
    pytest.mark.skipif(not (CHROMEDRIVER and CHROMIUM),
                       reason="needs Debian's chromium and chromium-driver "
                              "(.ci/test-packages.txt; apt-get install chromium chromium-driver)"),
]


@pytest.fixture(scope="module")
def ops() -> Iterator[OpsAgent]:
    yield from ops_agent()


@pytest.fixture(scope="module")
def browser(ops: OpsAgent) -> Iterator[Browser]:
    assert CHROMEDRIVER and CHROMIUM
    b = Browser(CHROMEDRIVER, CHROMIUM)
    try:
        b.get(f"http://admin:{ops.password}@127.0.0.1:{ops.port}/")
        yield b
    finally:
        b.close()


def _int(text: str | None) -> int | None:
    return int(text) if text and text.strip().isdigit() else None


def test_dashboard_live(ops: OpsAgent, browser: Browser, wait_for: Callable[..., Any]) -> None:
    b = browser
    wait_for(lambda: "Running" in (b.text(f'[data-pod="{GROUP}"] h3') or ""), 30.0,
             message="the pod Running on the page")
    b.screenshot(ARTIFACTS / "dashboard-start.png")
    b.script("window.__marker = 1")  # gone if the page reloads

    pleg = 'tr[data-proc="agent:pleg"] td.pid'
    before = wait_for(lambda: _int(b.text(pleg)), 10.0, message="pleg's pid shown")
    def click(action: str, name: str) -> None:  # retried: the page re-renders live
        css = f'button[data-action="{action}"][data-name="{name}"]'
        wait_for(lambda: b.click(css), 10.0, message=f"click {action} {name}")

    click("restart", "agent:pleg")
    wait_for(lambda: _int(b.text(pleg)) not in (None, before), 30.0,
             message="pleg's new pid on the page")

    restarts = f'tr[data-proc="{APP}"] td.restarts'
    wait_for(lambda: _int(b.text(restarts)) is not None, 10.0, message="restart count shown")
    count = _int(b.text(restarts)) or 0
    click("kill", APP)  # signal KILL, the default in the page's select
    wait_for(lambda: (_int(b.text(restarts)) or 0) > count, 60.0,
             message="the container's restart count grows")

    # a stopped subsystem: its heartbeat goes late on the page (the supervisor says so once),
    # and back to ok once it runs again
    hb = 'tr[data-proc="agent:prober"] td.hb'
    wait_for(lambda: b.text(hb) == "ok", 30.0, message="prober's heartbeat ok")
    ops.handle.call("kill", name="prober", signal="STOP")
    try:
        wait_for(lambda: (b.text(hb) or "").startswith("late "), 30.0,
                 message="prober's heartbeat late on the page")
        b.screenshot(ARTIFACTS / "dashboard-late.png")
    finally:
        ops.handle.call("kill", name="prober", signal="CONT")
    wait_for(lambda: b.text(hb) == "ok", 30.0, message="prober's heartbeat ok again")

    click("log", APP)
    first = wait_for(lambda: (b.text("#log") or "").count("tick"), 15.0, message="log lines")
    wait_for(lambda: (b.text("#log") or "").count("tick") > first, 15.0,
             message="new log lines arrive")
    assert b.script("return window.__marker") == 1  # all of it without reloading
    b.screenshot(ARTIFACTS / "dashboard.png")
