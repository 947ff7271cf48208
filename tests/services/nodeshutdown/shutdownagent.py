"""What the graceful node shutdown tests share: an agent on the stand-in API server with API
pods of several priorities, and what the runtime recorded of their containers once the agent
is gone (the embedded runtime served in the test process over the agent's state, as
``podvisorctl shutdown --pods`` does)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cri_api.v1 import api_pb2 as pb

from podvisor.common.logs import setup_logging
from podvisor.ipc.maps import NODE_SHUTDOWN_MESSAGE
from podvisor.services.runtime import serve_in_process
from podvisor.services.syncloop import labels as L
from tests.support.kubeapi import ApiError, KubeApi
from tests.support.lifecycle import cri_for, free_port

NODE = "e2e-shutdown"
TRAP = "trap 'exit 0' TERM; sleep 3600 & wait"


def create_pods(api: KubeApi, pods: dict[str, dict[str, Any]]) -> None:
    """Each pod ``name -> extra spec fields`` (priority, priorityClassName), grace 30 s."""
    for name, extra in pods.items():
        api.create_pod("default", {"metadata": {"name": name}, "spec": {
            "nodeName": NODE, "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 30, **extra,
            "containers": [{"name": "c", "image": "host", "command": ["sh", "-c", TRAP]}]}})


def start_agent(agent: Callable[..., Any], api: KubeApi, tmp: Path,
                shutdown: dict[str, Any]) -> Any:
    kubeconfig = api.kubeconfig(tmp / "node.kubeconfig", user=f"system:node:{NODE}",
                                groups=("system:nodes",))
    return agent(config={
        "nodeName": NODE, "kubeconfig": str(kubeconfig), "readOnlyPort": free_port(),
        "apiWatchTimeout": "5s", "statusSweepFrequency": "1s", "apiRetryMaxDelay": "1s",
        "nodeStatusUpdateFrequency": "500ms", **shutdown,
        "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}})


def phase(api: KubeApi, name: str) -> str:
    return str(((api.store.get("pods", "default", name) or {}).get("status")
                or {}).get("phase", ""))


def node_ready(api: KubeApi) -> dict[str, Any]:
    try:
        node = api.store.get("nodes", "", NODE)
    except ApiError:
        return {}
    conds = {c["type"]: c for c in node.get("status", {}).get("conditions", [])}
    return conds.get("Ready", {})  # type: ignore[no-any-return]


def exits(handle: Any, tmp: Path) -> dict[str, tuple[int, int]]:
    """pod name -> (finishedAt in ns, exit code) of its container, as the runtime recorded
    them (read after the agent exited)."""
    log = setup_logging("test-runtime", tmp, stream=open(os.devnull, "w"))  # noqa: SIM115
    with serve_in_process(handle.paths.runtime_dir, handle.paths.cri_socket, log):
        cri = cri_for(handle)
        try:
            out = {}
            for c in cri.list_containers():
                st = cri.container_status(c.id)
                if st.state == pb.CONTAINER_EXITED:
                    out[c.labels[L.POD_NAME]] = (st.finished_at, st.exit_code)
            return out
        finally:
            cri.close()


def assert_terminated_for_shutdown(api: KubeApi, names: list[str]) -> None:
    """Each pod Failed, reason Terminated, the kubelet's message and DisruptionTarget."""
    for name in names:
        st = api.store.get("pods", "default", name)["status"]
        assert (st["phase"], st["reason"], st["message"]) == (
            "Failed", "Terminated", NODE_SHUTDOWN_MESSAGE), (name, st)
        conds = {c["type"]: c for c in st["conditions"]}
        target = conds["DisruptionTarget"]
        assert (target["status"], target["reason"], target["message"]) == (
            "True", "TerminationByKubelet", NODE_SHUTDOWN_MESSAGE)


def assert_order(finished: dict[str, tuple[int, int]], groups: list[list[str]]) -> None:
    """Every container of a group exited (by its TERM trap: code 0, not a SIGKILL) before any
    of the next group's."""
    for name in (n for g in groups for n in g):
        assert finished[name][1] == 0, (name, finished[name])
    for earlier, later in itertools.pairwise(groups):
        assert max(finished[n][0] for n in earlier) <= min(finished[n][0] for n in later), (
            earlier, later, finished)
