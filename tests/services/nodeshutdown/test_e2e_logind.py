"""End to end: graceful node shutdown through systemd-logind over D-Bus, against a private
``dbus-daemon`` and a stand-in logind (``logind_standin.py``; this machine runs no systemd).
The agent (``DBUS_SYSTEM_BUS_ADDRESS`` pointing at that bus) takes a delay inhibitor lock
(who ``podvisor``) at start and reads ``InhibitDelayMaxSec``; on ``PrepareForShutdown(true)``
the Node goes NotReady, the ordinary pod is terminated before the critical one, both end
Failed/``Terminated``, the lock is released and the agent exits by itself."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.services.nodeshutdown.logind_standin import DbusDaemon, StandInLogind
from tests.services.nodeshutdown.shutdownagent import (
    assert_order,
    assert_terminated_for_shutdown,
    create_pods,
    exits,
    node_ready,
    phase,
    start_agent,
)
from tests.support.kubeapi import KubeApi

PODS = {"ordinary": {"priority": 10}, "critical": {"priority": 2000000000}}

pytestmark = pytest.mark.skipif(shutil.which("dbus-daemon") is None,
                                reason="needs dbus-daemon (Debian dbus; .ci/test-packages.txt)")


@pytest.mark.timeout(300)
def test_prepare_for_shutdown_from_logind_drains_and_releases_the_lock(
        agent: Any, wait_for: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bus = DbusDaemon(tmp_path / "dbus")
    logind = StandInLogind(bus.address, inhibit_delay_max=15.0)
    api = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    api.start()
    handle = None
    try:
        monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", bus.address)
        create_pods(api, PODS)
        handle = start_agent(agent, api, tmp_path, {
            "shutdownGracePeriod": "20s", "shutdownGracePeriodCriticalPods": "10s"})
        held = wait_for(logind.held, 30.0, 0.1, "the agent's inhibitor lock")
        assert [(i.what, i.who, i.mode) for i in held] == [("shutdown", "podvisor", "delay")]
        assert held[0].why
        wait_for(lambda: all(phase(api, n) == "Running" for n in PODS), 90.0, 0.2,
                 "both pods Running in the API")
        wait_for(lambda: node_ready(api).get("status") == "True", 30.0, 0.2, "Node Ready")
        logind.prepare_for_shutdown(True)
        assert handle.proc.wait(120) == 0, handle.stderr()
        wait_for(logind.released, 10.0, 0.1, "the lock released")
        assert logind.held() == []
        ready = node_ready(api)
        assert (ready["status"], ready["message"]) == ("False", "node is shutting down")
        assert_terminated_for_shutdown(api, list(PODS))
        assert_order(exits(handle, tmp_path), [["ordinary"], ["critical"]])
        log = (handle.paths.logs_dir / "nodeshutdown.log").read_text()
        # InhibitDelayMaxSec (15 s) is shorter than the groups' 20 s: said, and the groups scaled
        assert "nodeshutdown.inhibit_delay_short" in log and '"trigger": "logind"' in log
        assert '"grace": 7' in log  # each group its share of 15 s: int(10 * 15 / 20)
    finally:
        if handle is not None:
            assert handle.shutdown_pods().returncode == 0
        api.stop()
        logind.stop()
        bus.stop()
