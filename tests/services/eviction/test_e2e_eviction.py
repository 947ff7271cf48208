"""End to end: node-pressure eviction under real pressure the test makes, never the machine's.

A real agent (embedded runtime) registered with the tests' stand-in API server. Memory: the
pods' cgroup root (``cgroupRoot``) is a folder under the test's own memory cgroup with a 400Mi
``memory.limit_in_bytes``, so ``memory.available`` is 400Mi less its pods' working set; a
BestEffort hog takes 200Mi under ``memory.available<250Mi``. Disk: ``rootDir`` is a 64Mi tmpfs
the test mounts, a BestEffort pod fills an emptyDir under ``nodefs.available<60%``. Each time:
the Node gets the pressure condition and its taint, the BestEffort pod is Failed with reason
Evicted, the kubelet's message and the DisruptionTarget condition, the Guaranteed pod runs on,
a new BestEffort pod is refused while the pressure holds, and after the transition period the
condition and the taint are gone."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.containerd import remove_pod_cgroup
from tests.support.kubeapi import KubeApi
from tests.support.lifecycle import free_port

MEMORY = Path("/sys/fs/cgroup/memory")
GUARANTEED = {"limits": {"cpu": "100m", "memory": "32Mi"}}


def own_memory_cgroup() -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
    return "/"


@pytest.fixture
def limited_cgroup_root() -> Iterator[str]:
    """A cgroupRoot under this test's own memory cgroup, limited to 400Mi (requested before
    ``agent``: removed after the agent stopped)."""
    if not (MEMORY / "memory.limit_in_bytes").exists():
        pytest.skip("no cgroup v1 memory hierarchy on this host")
    root = f"{own_memory_cgroup().rstrip('/')}/pvevict-{secrets.token_hex(4)}"
    folder = MEMORY / root.strip("/")
    folder.mkdir()
    (folder / "memory.limit_in_bytes").write_text(str(400 << 20))
    yield root
    remove_pod_cgroup(root)


@contextlib.contextmanager
def tmpfs(size: str, prefix: str) -> Iterator[Path]:
    """A tmpfs of ``size`` the test mounts (to be rootDir's filesystem), unmounted at the end;
    the test is skipped with the reason where it cannot be mounted."""
    where = Path(f"/tmp/{prefix}-{secrets.token_hex(3)}")
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def small_fs() -> Iterator[Path]:
    """A 64Mi tmpfs (rootDir's filesystem)."""
    with tmpfs("64m", "pvfs") as where:
        yield where


def pod(name: str, node: str, command: list[str], resources: dict[str, Any] | None = None,
        volume: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": "host", "command": command}
    if resources:
        container["resources"] = resources
    spec: dict[str, Any] = {"nodeName": node, "automountServiceAccountToken": False,
                            "terminationGracePeriodSeconds": 1, "hostNetwork": True,
                            "containers": [container]}
    if volume:
        container["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    return {"metadata": {"name": name}, "spec": spec}


class Cluster:
    def __init__(self, api: KubeApi, node: str) -> None:
        self.api, self.node = api, node
        self.handle: Any = None

    def logs(self) -> str:
        """The eviction process's log (said when a wait fails)."""
        if self.handle is None:
            return ""
        log = self.handle.paths.logs_dir / "eviction.log"
        return log.read_text()[-4000:] if log.exists() else ""

    def status(self, name: str) -> dict[str, Any]:
        return (self.api.store.get("pods", "default", name) or {}).get("status") or {}

    def phase(self, name: str) -> str:
        return str(self.status(name).get("phase", ""))

    def condition(self, ctype: str) -> str:
        node = self.api.store.get("nodes", "", self.node) or {}
        for c in (node.get("status") or {}).get("conditions") or []:
            if c.get("type") == ctype:
                return str(c.get("status"))
        return ""

    def taints(self) -> list[str]:
        node = self.api.store.get("nodes", "", self.node) or {}
        return [t["key"] for t in (node.get("spec") or {}).get("taints") or []]


def start(agent: Any, tmp_path: Path, node: str, extra: dict[str, Any]) -> Cluster:
    api = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    api.start()
    kubeconfig = api.kubeconfig(tmp_path / "node.kubeconfig", user=f"system:node:{node}",
                                groups=("system:nodes",))
    c = Cluster(api, node)
    c.handle = agent(config={
        "nodeName": node, "kubeconfig": str(kubeconfig), "readOnlyPort": free_port(),
        "apiWatchTimeout": "5s", "statusSweepFrequency": "1s", "apiRetryMaxDelay": "1s",
        "nodeStatusUpdateFrequency": "1s", "stopPodsOnExit": True,
        "evictionMonitoringPeriod": "1s", "evictionPressureTransitionPeriod": "10s",
        "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}, **extra})
    return c


def check_evicted(c: Cluster, name: str, resource: str, wait_for: Any) -> None:
    wait_for(lambda: c.phase(name) == "Failed", 90.0, 0.2, f"{name} Failed (evicted)")
    st = c.status(name)
    assert st["reason"] == "Evicted"
    assert st["message"].startswith(f"The node was low on resource: {resource}. Threshold "
                                    "quantity: "), st["message"]
    assert f"Container {name} was using " in st["message"]
    assert f"has larger consumption of {resource}. " in st["message"]
    target = [x for x in st.get("conditions", []) if x["type"] == "DisruptionTarget"]
    assert [(x["status"], x["reason"]) for x in target] == [("True", "TerminationByKubelet")]


def check_refused_under(c: Cluster, condition: str, wait_for: Any) -> None:
    c.api.create_pod("default", pod("late", c.node, ["sleep", "3600"]))
    wait_for(lambda: c.phase("late") == "Failed", 60.0, 0.2, "the late BestEffort pod refused")
    st = c.status("late")
    assert st["reason"] == "Evicted"
    assert st["message"] == f"Pod was rejected: The node had condition: [{condition}]. "


@pytest.mark.timeout(300)
def test_memory_pressure_evicts_the_besteffort_pod_and_clears(
        limited_cgroup_root: str, agent: Any, wait_for: Any, tmp_path: Path) -> None:
    c = start(agent, tmp_path, "e2e-evict-mem", {
        "cgroupRoot": limited_cgroup_root, "evictionHard": {"memory.available": "250Mi"}})
    try:
        c.api.create_pod("default", pod("steady", c.node, ["sleep", "3600"], GUARANTEED))
        wait_for(lambda: c.phase("steady") == "Running", 90.0, 0.2, "steady Running")
        wait_for(lambda: c.condition("MemoryPressure") == "False", 60.0, 0.2, "no pressure")
        c.api.create_pod("default", pod("hog", c.node, [
            "python3", "-c", "import time; b = b'x' * (200 << 20); time.sleep(3600)"]))
        wait_for(lambda: c.condition("MemoryPressure") == "True", 90.0, 0.2, "MemoryPressure")
        wait_for(lambda: "node.kubernetes.io/memory-pressure" in c.taints(), 30.0, 0.2,
                 "the memory-pressure taint")
        check_evicted(c, "hog", "memory", wait_for)
        check_refused_under(c, "MemoryPressure", wait_for)
        wait_for(lambda: c.condition("MemoryPressure") == "False", 90.0, 0.2,
                 "MemoryPressure cleared after the transition period")
        wait_for(lambda: "node.kubernetes.io/memory-pressure" not in c.taints(), 30.0, 0.2,
                 "the taint removed")
        assert c.phase("steady") == "Running"
        assert c.condition("DiskPressure") == "False"
    except AssertionError:
        print(c.logs())
        raise
    finally:
        c.api.stop()


@pytest.mark.timeout(300)
def test_disk_pressure_evicts_the_besteffort_pod_and_clears(
        small_fs: Path, agent: Any, wait_for: Any, tmp_path: Path) -> None:
    c = start(agent, tmp_path, "e2e-evict-disk", {
        "rootDir": str(small_fs / "root"),
        "evictionHard": {"nodefs.available": "60%", "imagefs.available": "60%"}})
    try:
        c.api.create_pod("default", pod("steady", c.node, ["sleep", "3600"], GUARANTEED))
        wait_for(lambda: c.phase("steady") == "Running", 90.0, 0.2, "steady Running")
        wait_for(lambda: c.condition("DiskPressure") == "False", 60.0, 0.2, "no pressure")
        c.api.create_pod("default", pod("filler", c.node, [
            "sh", "-c", "dd if=/dev/zero of=/scratch/fill bs=1M count=32; sleep 3600"],
            volume=True))
        wait_for(lambda: c.condition("DiskPressure") == "True", 90.0, 0.2, "DiskPressure")
        wait_for(lambda: "node.kubernetes.io/disk-pressure" in c.taints(), 30.0, 0.2,
                 "the disk-pressure taint")
        wait_for(lambda: c.phase("filler") == "Failed", 90.0, 0.2, "filler Failed (evicted)")
        st = c.status("filler")
        assert st["reason"] == "Evicted"
        assert st["message"].startswith("The node was low on resource: ephemeral-storage. "
                                        "Threshold quantity: "), st["message"]
        check_refused_under(c, "DiskPressure", wait_for)
        wait_for(lambda: c.condition("DiskPressure") == "False", 90.0, 0.2,
                 "DiskPressure cleared (the evicted pod's emptyDir removed)")
        wait_for(lambda: "node.kubernetes.io/disk-pressure" not in c.taints(), 30.0, 0.2,
                 "the taint removed")
        assert c.phase("steady") == "Running"
    except AssertionError:
        print(c.logs())
        raise
    finally:
        c.api.stop()
