"""End to end: while a graceful node shutdown drains the node, a pod that arrives is refused as
the kubelet's node shutdown manager admits (``Admit``): phase Failed, reason ``NodeShutdown``,
``Pod was rejected: Pod was rejected as the node is shutting down.`` and a Warning Event (an
API pod; a static pod from the manifest folder just the same);
the running pod is left to the drain (reason ``Terminated``), and the refused pod holds
no group up. A real agent on the embedded runtime and the stand-in API server, the drain
started by ``podvisorctl shutdown --node``; the running pod ignores SIGTERM, so its group
lasts its 20 s and the late pod surely arrives during the drain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.services.nodeshutdown.shutdownagent import (
    NODE,
    assert_terminated_for_shutdown,
    create_pods,
    node_ready,
    phase,
    start_agent,
)
from tests.support.kubeapi import KubeApi

REFUSED = "Pod was rejected as the node is shutting down."


STATIC = """apiVersion: v1
kind: Pod
metadata: {name: static}
spec:
  containers:
  - {name: c, image: host, command: [sleep, "3600"]}
"""


def _local(handle: Any, name: str) -> dict[str, Any] | None:
    """The status ``podvisorctl pods`` shows of the pod ``name`` (a static pod's own), once
    Failed."""
    out = handle.ctl("pods", "--json")
    for p in json.loads(out.stdout).get("items", []) if out.returncode == 0 else []:
        if p["metadata"]["name"].startswith(f"{name}-") and \
                (p.get("status") or {}).get("phase") == "Failed":
            return p["status"]  # type: ignore[no-any-return]
    return None


def _events(api: KubeApi, name: str) -> list[dict[str, Any]]:
    return [e for e in api.store.list("events", "default")[0]
            if (e.get("involvedObject") or {}).get("name") == name]


@pytest.mark.timeout(300)
def test_a_pod_arriving_during_the_drain_is_refused_with_reason_node_shutdown(
        agent: Any, wait_for: Any, tmp_path: Path) -> None:
    api = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    api.start()
    handle = None
    try:
        api.create_pod("default", {"metadata": {"name": "stubborn"}, "spec": {
            "nodeName": NODE, "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "c", "image": "host",
                            "command": ["sh", "-c", "trap '' TERM; sleep 3600 & wait"]}]}})
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        handle = start_agent(agent, api, tmp_path, {"shutdownGracePeriodByPodPriority": [
            {"priority": 0, "shutdownGracePeriodSeconds": 20}],
            "staticPodPath": str(manifests)})
        wait_for(lambda: phase(api, "stubborn") == "Running", 90.0, 0.2, "stubborn Running")
        done = handle.ctl("shutdown", "--node", timeout=60)
        assert done.returncode == 0, done.stderr
        wait_for(lambda: node_ready(api).get("message") == "node is shutting down", 30.0, 0.2,
                 "the Node NotReady: node is shutting down")
        create_pods(api, {"late": {}})
        (manifests / "static.yaml").write_text(STATIC)  # a static pod: refused all the same
        wait_for(lambda: phase(api, "late") == "Failed", 30.0, 0.2, "the late pod refused")
        st = api.store.get("pods", "default", "late")["status"]
        assert (st["reason"], st["message"]) == ("NodeShutdown", f"Pod was rejected: {REFUSED}")
        assert not st.get("containerStatuses") or all(
            "running" not in (c.get("state") or {}) for c in st["containerStatuses"])
        found = wait_for(lambda: [e for e in _events(api, "late")
                                  if e.get("reason") == "NodeShutdown"], 30.0, 0.2,
                         "a NodeShutdown Event for the late pod")
        assert (found[0]["type"], found[0]["message"]) == ("Warning", REFUSED)
        static = wait_for(lambda: _local(handle, "static"), 30.0, 0.2,
                          "the static pod refused")
        assert (static["reason"], static["message"]) == (
            "NodeShutdown", f"Pod was rejected: {REFUSED}")
        assert handle.proc.wait(120) == 0, handle.stderr()
        assert_terminated_for_shutdown(api, ["stubborn"])
        assert api.store.get("pods", "default", "late")["status"]["reason"] == "NodeShutdown"
        log = (handle.paths.logs_dir / "nodeshutdown.log").read_text()
        assert '"pods": 1' in log  # nodeshutdown.done: the refused pod was never drained
    finally:
        if handle is not None:
            assert handle.shutdown_pods().returncode == 0
        api.stop()
