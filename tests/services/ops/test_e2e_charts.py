"""The node page's charts in Debian's Chromium (headless, over WebDriver): a pod's CPU rises on
the page when its container spins, and a restart mark appears on the subsystems' chart where
pleg was killed. Screenshots go to ``$PODVISOR_ARTIFACTS/ops/`` (``charts.png``)."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.services.ops.opsagent import GROUP, OpsAgent, ops_agent
from tests.services.ops.test_e2e_browser import ARTIFACTS, CHROMEDRIVER, CHROMIUM
from tests.services.ops.webdriver import Browser
from tests.support.lifecycle import pod_yaml

pytestmark = [
    pytest.mark.no_leak_check,  # one agent and one browser for the module, stopped by PID
    pytest.mark.skipif(not (CHROMEDRIVER and CHROMIUM),
                       reason="needs Debian's chromium and chromium-driver "
                              "(.ci/test-packages.txt; apt-get install chromium chromium-driver)"),
]

@pytest.fixture(scope="module")
def spin() -> Iterator[Path]:
    """The flag file: while it exists, the pod's container spins one core."""
    flags = Path(tempfile.mkdtemp(prefix="pvspin", dir="/tmp"))
    try:
        yield flags / "spin"
    finally:
        shutil.rmtree(flags, ignore_errors=True)


@pytest.fixture(scope="module")
def ops(spin: Path) -> Iterator[OpsAgent]:
    command = f"while true; do while [ -e {spin} ]; do :; done; echo tick; sleep 0.2; done"
    yield from ops_agent(pod_yaml("web", command, container="app", grace=1))


@pytest.fixture(scope="module")
def browser(ops: OpsAgent) -> Iterator[Browser]:
    assert CHROMEDRIVER and CHROMIUM
    b = Browser(CHROMEDRIVER, CHROMIUM)
    try:
        b.get(f"http://admin:{ops.password}@127.0.0.1:{ops.port}/")
        yield b
    finally:
        b.close()


def _detail_cpu(b: Browser) -> int | None:
    raw = b.script('const e = document.querySelector(\'[data-panel="detail"] .now\');'
                   "return e ? e.dataset.cpu : null;")
    return int(raw) if isinstance(raw, str) and raw.isdigit() else None


def test_pod_cpu_rises_when_it_spins(ops: OpsAgent, browser: Browser, spin: Path,
                                     wait_for: Callable[..., Any]) -> None:
    b = browser
    wait_for(lambda: b.script(f"return Charts.latest()[{GROUP!r}] || null"), 60.0,
             message="a sample of the pod on the page")
    wait_for(lambda: b.click(f'button[data-action="chart"][data-name="{GROUP}"]'), 10.0,
             message="open the pod's chart")
    idle = wait_for(lambda: (c := _detail_cpu(b)) is not None and (c,), 30.0,
                    message="the pod's CPU on its chart")[0]
    spin.touch()
    try:
        # a spinning shell takes a core on an idle machine; on this shared one (other
        # sessions' suites: load averages of 30 on 2 cores) a tenth of one is what is sure
        busy = wait_for(lambda: (c := _detail_cpu(b)) is not None and c >= idle + 100
                        and c >= 2 * idle and c, 120.0,
                        message=f"the pod's CPU rising on its chart (idle {idle}m)")
        b.script("document.getElementById('charts').scrollIntoView()")
        b.screenshot(ARTIFACTS / "charts-spin.png")
    finally:
        spin.unlink(missing_ok=True)
    assert busy > idle
    # the pod's line shows it too, not only the readout: the last point of its series
    drawn = b.script('const p = document.querySelector(\'[data-chart="detail-0"]\');'
                     "return p ? p.querySelectorAll('canvas').length : 0;")
    assert drawn


def test_restart_mark_where_a_subsystem_was_killed(ops: OpsAgent, browser: Browser,
                                                    wait_for: Callable[..., Any]) -> None:
    b = browser
    wait_for(lambda: b.find('[data-chart="agents-0"]'), 30.0, message="the subsystems' chart")
    before = ops.handle.state("pleg")["pid"]
    killed_at = time.time()
    ops.handle.call("kill", name="pleg", signal="KILL")
    ops.handle.wait_state("pleg", "RUNNING", 30.0, where=lambda r: r["pid"] != before)
    css = '[data-chart="agents-0"] .mark.restart[data-name="agent:pleg"]'
    t = wait_for(lambda: b.script(f"const m = document.querySelector('{css}');"
                                  "return m ? Number(m.dataset.t) : null;"), 30.0,
                 message="a restart mark of pleg on the subsystems' chart")
    assert killed_at - 1 <= t <= killed_at + 30, (killed_at, t)
    fault = b.script("const m = document.querySelector('[data-chart=\"agents-0\"] "
                     ".mark.fault[data-name=\"agent:pleg\"]'); return m ? m.title : null;")
    assert fault and "SIGKILL" in fault, fault
    b.script("document.getElementById('charts').scrollIntoView()")
    b.screenshot(ARTIFACTS / "charts.png")
