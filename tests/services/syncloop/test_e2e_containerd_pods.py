"""End to end on containerd: the agent with `runtimeEndpoint: <containerd>` runs two of the
containerd example manifests (deploy/examples/containerd/, busybox image) to Running in /pods,
and deleting a manifest removes its pod. Skipped with the reason when no containerd is
available (tests/support/containerd.py `containerd_or_skip()`); every sandbox created here is
removed; pods go under a per-test `cgroupRoot`, removed at the end."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from podvisor.services.cri import CriError, new_runtime_client
from podvisor.services.cri.client import RuntimeClient
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.cgroupfs import new_cgroup_fs
from podvisor.services.syncloop.podcgroups import hierarchy_dirs, parse_mountinfo
from tests.support.containerd import ContainerdHandle, containerd_or_skip, remove_pod_cgroup
from tests.support.lifecycle import agent_config, all_running, free_port, get_pods

pytestmark = pytest.mark.containerd
EXAMPLES = Path(__file__).resolve().parents[3] / "deploy" / "examples" / "containerd"


@pytest.fixture(scope="module")
def containerd() -> ContainerdHandle:
    """Module scope: the session's containerd starts before the per-test leak snapshot."""
    return containerd_or_skip()


def folders(cgroup_path: str) -> list[str]:
    return hierarchy_dirs(parse_mountinfo(new_cgroup_fs().mountinfo()), cgroup_path)


def ours(cri: RuntimeClient, uids: set[str]) -> list[Any]:
    return [s for s in cri.list_pod_sandbox() if s.labels.get(L.POD_UID) in uids]


def clean(cri: RuntimeClient, cgroup_root: str, uids: set[str]) -> None:
    """Remove every sandbox of `uids` the agent may have left, and the test's cgroup root (the
    agent removes the pods' own folders; the root stays, as the kubelet's does)."""
    for sandbox in ours(cri, uids):
        try:
            cri.stop_pod_sandbox(sandbox.id)
            cri.remove_pod_sandbox(sandbox.id)
        except CriError:
            pass
    remove_pod_cgroup(cgroup_root)


@pytest.mark.timeout(170)
def test_containerd_examples_run_and_delete(agent: Any, containerd: ContainerdHandle,
                                            manifests: Path, wait_for: Any) -> None:
    shutil.copy(EXAMPLES / "logger.yaml", manifests / "logger.yaml")
    # the init example as shipped, but a 3 s grace: its `sleep` as PID 1 ignores TERM, and the
    # default 30 s would make the agent's stop (stopPodsOnExit) wait that long
    init = yaml.safe_load((EXAMPLES / "init.yaml").read_text("utf-8"))
    init["spec"]["terminationGracePeriodSeconds"] = 3
    (manifests / "init.yaml").write_text(yaml.safe_dump(init), "utf-8")
    port = free_port()
    cri = new_runtime_client(containerd.endpoint, timeout=30.0)
    uids: set[str] = set()
    cgroup_root = f"/podvisor-test-{secrets.token_hex(4)}"  # pods go under it (cgroupRoot)
    try:
        handle = agent(config=agent_config(manifests, port, runtimeEndpoint=containerd.endpoint,
                                           stopPodsOnExit=True, cgroupRoot=cgroup_root))
        body = wait_for(lambda: (b := get_pods(port)) and all_running(b, {"logger", "with-init"})
                        and b, 120.0, 0.2, "both example pods Running in /pods")
        uids = {p["metadata"]["uid"] for p in body["items"]}
        by_name = {p["metadata"]["name"]: p for p in body["items"]}
        assert {c["name"] for c in by_name["with-init-e2e"]["status"]["initContainerStatuses"]} \
            == {"first", "second"}
        assert all(c["containerID"].startswith("containerd://")
                   for p in body["items"] for c in p["status"]["containerStatuses"])
        assert len(ours(cri, uids)) == 2
        logger_uid = by_name["logger-e2e"]["metadata"]["uid"]
        (manifests / "logger.yaml").unlink()
        wait_for(lambda: (b := get_pods(port)) and [p["metadata"]["name"] for p in b["items"]]
                 == ["with-init-e2e"], 60.0, 0.2, "the logger pod to leave /pods")
        wait_for(lambda: not ours(cri, {logger_uid}), 60.0, 0.2, "the logger sandbox removed")
        assert handle.stop() == 0  # stopPodsOnExit: the other pod goes too
        wait_for(lambda: not ours(cri, uids), 60.0, 0.2, "every sandbox removed")
        # the agent removed both pods' cgroup folders (one at deletion, one on exit)
        left = [d for uid in uids for qos in ("", "burstable/", "besteffort/")
                for d in folders(f"{cgroup_root}/{qos}pod{uid}") if os.path.exists(d)]
        assert not left, left
    finally:
        clean(cri, cgroup_root, uids)
        cri.close()
