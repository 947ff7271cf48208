"""End to end: graceful node shutdown without logind (this machine has none). A real agent on
the embedded runtime and the stand-in API server, API pods of several priorities (one critical
through ``priorityClassName: system-node-critical``): ``podvisorctl shutdown --node``, or SIGTERM
of the agent with ``shutdownOnSignal``, reports the Node NotReady ("node is shutting down"),
terminates the pods group by group in ascending priority (the order read from the containers'
exit times the runtime recorded), leaves each Failed with reason ``Terminated``, the kubelet's
message and DisruptionTarget, and then the agent exits 0."""

from __future__ import annotations

import shlex
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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

PODS = {"low": {}, "mid": {"priority": 1000}, "high": {"priority": 100000},
        "critical": {"priorityClassName": "system-node-critical"}}


def _shutdown(agent: Callable[..., Any], wait_for: Callable[..., Any], tmp_path: Path,
              config: dict[str, Any], trigger: Callable[[Any], None],
              groups: list[list[str]]) -> None:
    api = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    api.start()
    handle = None
    try:
        create_pods(api, PODS)
        handle = start_agent(agent, api, tmp_path, config)
        wait_for(lambda: all(phase(api, n) == "Running" for n in PODS), 90.0, 0.2,
                 "every pod Running in the API")
        wait_for(lambda: node_ready(api).get("status") == "True", 30.0, 0.2, "Node Ready")
        trigger(handle)
        assert handle.proc.wait(120) == 0, handle.stderr()
        ready = node_ready(api)
        assert (ready["status"], ready["reason"], ready["message"]) == (
            "False", "KubeletNotReady", "node is shutting down")
        assert_terminated_for_shutdown(api, list(PODS))
        assert_order(exits(handle, tmp_path), groups)
        log = (handle.paths.logs_dir / "nodeshutdown.log").read_text()
        assert '"grace": 10' in log and "nodeshutdown.done" in log  # min(group, pod's 30)
    finally:
        if handle is not None:
            assert handle.shutdown_pods().returncode == 0  # the advice the agent prints
        api.stop()


@pytest.mark.timeout(300)
def test_shutdown_node_terminates_pods_by_priority(agent: Any, wait_for: Any,
                                                   tmp_path: Path) -> None:
    """``shutdownGracePeriodByPodPriority``: four groups, one pod each, in priority order."""
    by_priority = [{"priority": p, "shutdownGracePeriodSeconds": 10}
                   for p in (0, 1000, 100000, 2000000000)]

    def ctl(handle: Any) -> None:
        # the command the agent printed at start, run as printed
        printed = [line.strip() for line in handle.stderr().splitlines()
                   if line.startswith("  ") and line.endswith(" shutdown --node")]
        assert len(printed) == 1, handle.stderr()
        assert f"--root-dir {handle.paths.root} " in printed[0]
        done = subprocess.run(shlex.split(printed[0]), capture_output=True, text=True,
                              timeout=60, cwd="/")
        assert done.returncode == 0 and "shutting down" in done.stdout, done.stderr

    _shutdown(agent, wait_for, tmp_path, {"shutdownGracePeriodByPodPriority": by_priority},
              ctl, [["low"], ["mid"], ["high"], ["critical"]])


@pytest.mark.timeout(300)
def test_sigterm_with_shutdown_on_signal_keeps_critical_pods_last(agent: Any, wait_for: Any,
                                                                  tmp_path: Path) -> None:
    """``shutdownGracePeriod`` 20 s with 10 s for critical pods (the kubelet's migration: two
    groups): SIGTERM of the agent stops the three ordinary pods, then the critical one."""
    config = {"shutdownGracePeriod": "20s", "shutdownGracePeriodCriticalPods": "10s",
              "shutdownOnSignal": True}
    def sigterm(handle: Any) -> None:
        assert "Ctrl-C drains the node" in handle.stderr()  # the start line says so
        handle.proc.send_signal(signal.SIGTERM)

    _shutdown(agent, wait_for, tmp_path, config, sigterm, [["low", "mid", "high"], ["critical"]])
