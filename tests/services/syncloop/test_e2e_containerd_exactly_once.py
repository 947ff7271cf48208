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

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from cri_api.v1 import api_pb2 as pb

from podvisor.common.crashpoints import ENV_AT, ENV_ONCE_DIR
from podvisor.services.cri import CriError, new_runtime_client
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.cgroupfs import new_cgroup_fs
from podvisor.services.syncloop.podcgroups import hierarchy_dirs, parse_mountinfo
from tests.support.containerd import (
    DEPLOY_DIR,
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


class PrivateContainerd:
    """A containerd instance of this test alone (deploy/containerd), no pod network."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pvxk", dir="/tmp"))
        self.env = {**os.environ, "PODVISOR_CONTAINERD_CNI": "off"}
        self.endpoint = f"unix://{self.dir}/run/containerd.sock"

    def script(self, name: str, *args: str) -> None:
        done = subprocess.run([str(DEPLOY_DIR / name), *args, str(self.dir)], env=self.env,
                              capture_output=True, text=True, timeout=180, check=False)
        if done.returncode != 0:
            raise AssertionError(f"{name} failed: {done.stderr.strip()[-2000:]}")

    def start(self) -> None:
        self.script("start.sh")

    def pid(self) -> int:
        return int((self.dir / "containerd.pid").read_text().strip())

    def kill9(self) -> None:
        """SIGKILL this instance's containerd (started here, by its pid) and reap it."""
        proc = psutil.Process(self.pid())
        proc.send_signal(signal.SIGKILL)
        try:
            os.waitpid(proc.pid, 0)  # our child: pytest is a subreaper (tests/conftest.py)
        except ChildProcessError:
            proc.wait(30)

    def stop(self) -> None:
        if (self.dir / "config.toml").exists():
            subprocess.run([str(DEPLOY_DIR / "stop.sh"), "--purge", str(self.dir)],
                           env=self.env, capture_output=True, timeout=180, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


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
    inst = PrivateContainerd()
    try:
        inst.script("setup.sh", "--no-install")
        inst.start()
        yield inst
    finally:
        inst.stop()


# --- the burst -------------------------------------------------------------------------------


def manifest(name: str, image: str, tag: str) -> dict[str, Any]:
    """`sleep <tag>` as the container's own process (PID 1 of its namespace: TERM does nothing,
    so a 1 s grace keeps removal short)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "c", "image": image,
                                     "imagePullPolicy": "IfNotPresent",
                                     "command": ["sleep", tag]}]}}


def sleepers(tags: dict[str, str]) -> dict[str, int]:
    """pod -> live (not zombie) processes running its `sleep <tag>`."""
    by_tag = {tag: pod for pod, tag in tags.items()}
    out = dict.fromkeys(tags, 0)
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = proc.info["cmdline"] or []
        if (len(cmd) == 2 and cmd[0] == "sleep" and cmd[1] in by_tag
                and proc.info["status"] != psutil.STATUS_ZOMBIE):
            out[by_tag[cmd[1]]] += 1
    return out


def base_name(pod_name: str) -> str:
    """A static pod's name without the "-<nodeName>" suffix."""
    return pod_name.rsplit("-", 1)[0]


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
                yaml.safe_dump(manifest(name, image, tag)), "utf-8")
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
        body = get_pods(self.port)
        if body is None:
            return False
        seen = set()
        for pod in body.get("items", []):
            st = pod.get("status", {})
            cs = st.get("containerStatuses", [])
            if (st.get("phase") == "Running" and cs
                    and all("running" in c.get("state", {}) for c in cs)):
                seen.add(base_name(pod["metadata"]["name"]))
        return seen >= set(self.tags)

    def pods_restart_counts(self) -> dict[str, list[int]]:
        body = get_pods(self.port) or {}
        return {base_name(p["metadata"]["name"]): [c.get("restartCount", -1) for c in
                                                  p["status"].get("containerStatuses", [])]
                for p in body.get("items", []) if base_name(p["metadata"]["name"]) in self.tags}

    def tally(self) -> Tally:
        ready: Counter[str] = Counter()
        sandboxes: Counter[str] = Counter()
        running: Counter[str] = Counter()
        containers: Counter[str] = Counter()
        restarts: dict[str, list[int]] = {}
        for s in self.cri.list_pod_sandbox():
            if (pod := self.ours(s.labels)) is not None:
                sandboxes[pod] += 1
                ready[pod] += s.state == pb.SANDBOX_READY
        for c in self.cri.list_containers():
            if (pod := self.ours(c.labels)) is not None:
                containers[pod] += 1
                if c.state == pb.CONTAINER_RUNNING:
                    running[pod] += 1
                    restarts.setdefault(pod, []).append(int(c.annotations[L.RESTART_COUNT]))
        zero = dict.fromkeys(self.tags, 0)
        return Tally({**zero, **ready}, {**zero, **sandboxes}, {**zero, **running},
                     {**zero, **containers}, restarts, sleepers(self.tags))

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

    def in_cgroups(self) -> list[str]:
        """Every process left in the pods' cgroups under the agent's cgroupRoot (pause, runc
        init, anything), as "pid cmdline"."""
        out = []
        mounts = parse_mountinfo(new_cgroup_fs().mountinfo())
        for folder in hierarchy_dirs(mounts, self.cgroup_root):
            # os.walk, not rglob: a pod's folder removed while it is walked is skipped
            # (rglob raised FileNotFoundError when the sync loop removed one meanwhile)
            for here, _dirs, files in os.walk(folder):
                if "cgroup.procs" not in files:
                    continue
                procs = Path(here) / "cgroup.procs"
                with contextlib.suppress(OSError):
                    for pid in procs.read_text().split():
                        with contextlib.suppress(psutil.Error):
                            out.append(f"{pid} {' '.join(psutil.Process(int(pid)).cmdline())}")
        return sorted(set(out))

    def remove(self, wait_for: Callable[..., Any]) -> None:
        for name in self.tags:
            (self.manifests / f"{name}.yaml").unlink()
        wait_for(lambda: not any(sleepers(self.tags).values()), 60.0, 0.05,
                 "no process left once the manifests are gone")
        wait_for(self.gone, 60.0, 0.05, "no sandbox nor container of the pods left")
        wait_for(lambda: not self.in_cgroups(), 30.0, 0.05,
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
