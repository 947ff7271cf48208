"""End to end on containerd, exactly once (issue 22, item 3): a burst of pods on containerd while
the agent's sync loop, or containerd itself, is killed with SIGKILL, and the sync loop's crash
points (``PODVISOR_CRASH_AT``, common/crashpoints.py) on containerd.

Each pod is a hostNetwork busybox container running ``sleep <tag>`` with a number unique to
the test, so the kernel's process table can count each pod's processes. Afterwards every pod is
Running in /pods with restartCount 0, containerd's CRI lists exactly one ready sandbox and one
running container (task) per pod, exactly one live ``sleep <tag>`` runs per pod, and once the
manifests are removed no sandbox or container of theirs is left and no process of any kind in
their cgroups.

Each test runs on a PRIVATE containerd it sets up and starts (deploy/containerd/setup.sh +
start.sh, no pod network: the pods are hostNetwork) and stops with stop.sh --purge after the
agent: containerd's kill needs one (the session's instance is never killed), and a call
cancelled by the sync loop's death can leave containerd's shim of the pod running after the
pod is gone (an idle containerd-shim holding no process: containerd's, see docs/ARCHITECTURE.md
"Exactly once on containerd"), which must not outlive the test on the session's instance (a
later test counts that instance's shims). Setting one up and starting it takes about 2 s
here, stopping it about 2 s: no `slow` mark. Skipped with the reason when the session has no
containerd (tests/support/containerd.py ``containerd_or_skip()``) or this test cannot start
one (not root, tools missing). Pods go under a per-test ``cgroupRoot``, removed at the end.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cri_api.v1 import api_pb2 as pb

from podvisor.common.crashpoints import ENV_AT, ENV_ONCE_DIR
from podvisor.services.cri import CriError, new_runtime_client
from podvisor.services.syncloop import labels as L
from tests.support.burst import (
    CriCounts,
    PrivateContainerd,
    base_name,
    in_cgroups,
    running_pods,
    sleep_manifest,
    sleepers,
)
from tests.support.containerd import (
    ContainerdHandle,
    containerd_or_skip,
    remove_pod_cgroup,
)
from tests.support.lifecycle import agent_config, free_port, get_pods

pytestmark = pytest.mark.containerd


@pytest.fixture(scope="module")
def containerd() -> ContainerdHandle:
    """Module scope: the session's containerd starts before the per-test leak snapshot."""
    return containerd_or_skip()


# --- a containerd of the test's own ----------------------------------------------------------


@pytest.fixture
def private_containerd(containerd: ContainerdHandle) -> Iterator[PrivateContainerd]:
    """Skipped (with the reason) where the session's containerd runs but this test cannot
    start one of its own."""
    if os.geteuid() != 0:
        pytest.skip("killing containerd needs a private instance, and starting one needs root")
    missing = [tool for tool in ("containerd", "ctr", "containerd-shim-runc-v2", "runc")
               if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"a private containerd needs {', '.join(missing)} here")
    inst = PrivateContainerd(Path(tempfile.mkdtemp(prefix="pvxk", dir="/tmp")))
    try:
        inst.setup_and_start()
        yield inst
    finally:
        inst.stop()


# --- the burst -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tally:
    """What containerd and the kernel show for the burst's pods (pod -> count)."""

    ready_sandboxes: dict[str, int]
    sandboxes: dict[str, int]
    running: dict[str, int]
    containers: dict[str, int]
    restarts: dict[str, list[int]]
    processes: dict[str, int]


class Burst:
    """``n`` pods dropped into staticPodPath at once, on the agent given at ``start``."""

    def __init__(self, endpoint: str, image: str, n: int) -> None:
        self.endpoint = endpoint
        prefix = f"xo{secrets.token_hex(2)}"
        base = 700000000 + secrets.randbelow(10000) * 1000
        self.tags = {f"{prefix}n{i}": str(base + i) for i in range(n)}
        self.tmp = Path(tempfile.mkdtemp(prefix="pvxc", dir="/tmp"))
        self.manifests, self.staging = self.tmp / "m", self.tmp / "s"
        self.manifests.mkdir()
        self.staging.mkdir()
        for name, tag in self.tags.items():
            (self.staging / f"{name}.yaml").write_text(
                yaml.safe_dump(sleep_manifest(name, image, tag)), "utf-8")
        self.cgroup_root = f"/podvisor-test-{secrets.token_hex(4)}"
        self.port = free_port()
        self.cri = new_runtime_client(endpoint, timeout=10.0)
        self.handle: Any = None

    def config(self, **extra: Any) -> dict[str, Any]:
        return agent_config(self.manifests, self.port, runtimeEndpoint=self.endpoint,
                            stopPodsOnExit=True, cgroupRoot=self.cgroup_root, **extra)

    def start(self, agent: Callable[..., Any], wait_for: Callable[..., Any]) -> None:
        self.handle = agent(config=self.config())
        wait_for(lambda: get_pods(self.port) is not None, 60.0, 0.05, "/pods answering")

    def drop(self) -> None:
        """Every manifest at once (renames within one file system)."""
        for name in self.tags:
            (self.staging / f"{name}.yaml").rename(self.manifests / f"{name}.yaml")

    def ours(self, labels: Any) -> str | None:
        name = base_name(labels.get(L.POD_NAME, ""))
        return name if name in self.tags else None

    def running_count(self) -> int:
        """Running containers of the burst (0 while containerd does not answer)."""
        try:
            return sum(1 for c in self.cri.list_containers()
                       if c.state == pb.CONTAINER_RUNNING and self.ours(c.labels))
        except CriError:
            return 0

    def all_running(self) -> bool:
        """Every pod Running in /pods, each container running."""
        return running_pods(get_pods(self.port)) >= set(self.tags)

    def pods_restart_counts(self) -> dict[str, list[int]]:
        body = get_pods(self.port) or {}
        return {base_name(p["metadata"]["name"]): [c.get("restartCount", -1) for c in
                                                  p["status"].get("containerStatuses", [])]
                for p in body.get("items", []) if base_name(p["metadata"]["name"]) in self.tags}

    def tally(self) -> Tally:
        c = CriCounts.of(self.cri, self.ours)
        return Tally(c.per_pod(c.ready, self.tags), c.per_pod(c.sandboxes, self.tags),
                     c.per_pod(c.running, self.tags), c.per_pod(c.containers, self.tags),
                     c.restarts, sleepers(self.tags))

    def check_once(self, wait_for: Callable[..., Any], after: str) -> Tally:
        wait_for(self.all_running, 120.0, 0.05, f"every pod Running after {after}")
        one = dict.fromkeys(self.tags, 1)
        # the sync that made a pod Running may still be removing a dead sandbox of its own
        wait_for(lambda: self.tally().sandboxes == one, 60.0, 0.05,
                 f"one sandbox per pod after {after}")
        t = self.tally()
        assert t.processes == one, f"each pod's command runs once after {after}"
        assert t.ready_sandboxes == one, f"one ready sandbox per pod after {after}"
        assert t.running == one, f"one running container (task) per pod after {after}"
        assert t.containers == one, f"no other container of the pods after {after}:\n" \
            f"{self.describe()}"
        assert t.restarts == {pod: [0] for pod in self.tags}, \
            f"no restart counted ({after}):\n{self.describe()}"
        assert self.pods_restart_counts() == {pod: [0] for pod in self.tags}, \
            f"restartCount 0 in /pods after {after}"
        return t

    def describe(self) -> str:
        """containerd's view of the pods, for a failed assertion."""
        lines = []
        try:
            for s in self.cri.list_pod_sandbox():
                if (pod := self.ours(s.labels)) is not None:
                    lines.append(f"sandbox {pod} {s.id[:12]} attempt {s.metadata.attempt} "
                                 f"{pb.PodSandboxState.Name(s.state)}")
            for c in self.cri.list_containers():
                if (pod := self.ours(c.labels)) is not None:
                    st = self.cri.container_status(c.id)
                    lines.append(f"container {pod} {c.id[:12]} attempt {c.metadata.attempt} "
                                 f"{pb.ContainerState.Name(c.state)} exit {st.exit_code} "
                                 f"{st.reason} {st.message[:200]!r}")
        except CriError as err:
            lines.append(f"({err})")
        return "\n".join(sorted(lines))

    def gone(self) -> bool:
        try:
            return (not any(self.ours(s.labels) for s in self.cri.list_pod_sandbox())
                    and not any(self.ours(c.labels) for c in self.cri.list_containers()))
        except CriError:
            return False

    def remove(self, wait_for: Callable[..., Any]) -> None:
        for name in self.tags:
            (self.manifests / f"{name}.yaml").unlink()
        wait_for(lambda: not any(sleepers(self.tags).values()), 60.0, 0.05,
                 "no process left once the manifests are gone")
        wait_for(self.gone, 60.0, 0.05, "no sandbox nor container of the pods left")
        wait_for(lambda: not in_cgroups(self.cgroup_root), 30.0, 0.05,
                 "no process of any kind left in the pods' cgroups")

    def close(self) -> None:
        """Whatever a failed test left: the agent, then every sandbox of ours, the cgroups."""
        if self.handle is not None:
            self.handle.stop(60.0)
        try:
            for s in self.cri.list_pod_sandbox():
                if self.ours(s.labels):
                    self.cri.stop_pod_sandbox(s.id)
                    self.cri.remove_pod_sandbox(s.id)
        except CriError:
            pass
        self.cri.close()
        remove_pod_cgroup(self.cgroup_root)
        shutil.rmtree(self.tmp, ignore_errors=True)


def kill9(handle: Any, name: str, wait_for: Callable[..., Any]) -> None:
    """SIGKILL the agent's subsystem ``name`` and wait for the supervisor's new one."""
    old = handle.state(name)["pid"]
    handle.call("kill", name=name, signal="KILL")
    wait_for(lambda: (s := handle.state(name))["state"] == "RUNNING" and s["pid"] != old,
             30.0, 0.02, f"{name} restarted")


@pytest.fixture
def burst_of(containerd: ContainerdHandle,
             private_containerd: PrivateContainerd) -> Iterator[Callable[..., Burst]]:
    """Bursts on the test's own containerd (set up before, and stopped after, the agent)."""
    made: list[Burst] = []

    def make(n: int) -> Burst:
        b = Burst(private_containerd.endpoint, containerd.image, n)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


# --- the sync loop killed mid-burst ------------------------------------------------------------


@pytest.mark.timeout(240)
def test_kill9_syncloop_during_a_burst_on_containerd(agent: Any, wait_for: Any,
                                                     burst_of: Callable[..., Burst]) -> None:
    """12 pods at once; SIGKILL of the sync loop once the first 3 containers run, while the
    others' RunPodSandbox, CreateContainer and StartContainer are in flight (containerd goes on
    with, or cleans up, a call whose client went away)."""
    burst = burst_of(12)
    burst.start(agent, wait_for)
    burst.drop()
    wait_for(lambda: burst.running_count() >= 3, 60.0, 0.005, "the first containers running")
    kill9(burst.handle, "syncloop", wait_for)
    burst.check_once(wait_for, "the sync loop's kill -9")
    burst.remove(wait_for)


# --- containerd killed mid-burst -------------------------------------------------------------


@pytest.mark.timeout(300)
def test_kill9_containerd_during_a_burst(agent: Any, wait_for: Any,
                                         private_containerd: PrivateContainerd,
                                         burst_of: Callable[..., Burst]) -> None:
    """12 pods at once on a private containerd; SIGKILL of containerd once the first 3
    containers run, then containerd started again (its shims and their tasks live on). The
    calls in flight are cut off half-way: a sandbox or container recorded without its status,
    a task created for a container the restarted containerd lists as created and refuses to
    start."""
    burst = burst_of(12)
    burst.start(agent, wait_for)
    burst.drop()
    wait_for(lambda: burst.running_count() >= 3, 60.0, 0.005, "the first containers running")
    private_containerd.kill9()
    private_containerd.start()
    burst.check_once(wait_for, "containerd's kill -9 and restart")
    burst.remove(wait_for)


# --- the sync loop's crash points --------------------------------------------------------------


@pytest.mark.timeout(240)
@pytest.mark.parametrize("point", [
    "syncloop:sync.after_sandbox",
    "syncloop:sync.after_create",
])
def test_a_sync_loop_crash_on_the_start_path_runs_each_pod_once(
        point: str, agent: Any, wait_for: Any, burst_of: Callable[..., Burst],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync loop SIGKILLs itself at ``point`` (once), the other pods' calls in flight.
    After RunPodSandbox: the new sync loop uses that sandbox. After CreateContainer: the
    container is created and never started, and it holds its attempt's name in containerd (a
    second CreateContainer of the attempt is refused): the new sync loop starts it as it is."""
    once = Path(tempfile.mkdtemp(prefix="pvxo", dir="/tmp"))
    try:
        monkeypatch.setenv(ENV_AT, point)
        monkeypatch.setenv(ENV_ONCE_DIR, str(once))
        burst = burst_of(3)
        burst.start(agent, wait_for)
        burst.drop()
        burst.check_once(wait_for, f"the crash at {point}")
        assert (once / point.replace(":", ".", 1)).exists(), f"{point} was reached"
        burst.remove(wait_for)
    finally:
        shutil.rmtree(once, ignore_errors=True)


@pytest.mark.timeout(240)
def test_a_sync_loop_crash_on_the_stop_path_leaves_nothing(
        agent: Any, wait_for: Any, burst_of: Callable[..., Burst],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync loop SIGKILLs itself after stopping a pod's containers, before its sandbox is
    stopped and removed: the new sync loop finishes the termination."""
    once = Path(tempfile.mkdtemp(prefix="pvxo", dir="/tmp"))
    try:
        monkeypatch.setenv(ENV_AT, "syncloop:terminate.after_stop")
        monkeypatch.setenv(ENV_ONCE_DIR, str(once))
        burst = burst_of(3)
        burst.start(agent, wait_for)
        burst.drop()
        burst.check_once(wait_for, "the start")
        burst.remove(wait_for)
        assert (once / "syncloop.terminate.after_stop").exists(), "the crash point was reached"
    finally:
        shutil.rmtree(once, ignore_errors=True)
