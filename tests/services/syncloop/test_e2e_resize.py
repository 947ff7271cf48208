"""In-place pod resize end to end (issue 24: InPlacePodVerticalScaling, beta and on in 1.33), on
the embedded runtime, through the stand-in API server's ``pods/<name>/resize`` subresource with
real ``kubectl patch --subresource resize``:

- a NotRequired resize keeps the container (same PID, no restart counted) and rewrites its cgroup
  (cpu.cfs_quota_us, memory.limit_in_bytes read from the cgroup v1 files), the pod's cgroup too;
  ``containerStatuses[].resources`` / ``allocatedResources`` show it and ``PodResizeInProgress``
  goes away;
- a memory change whose resizePolicy is RestartContainer restarts that container (a new PID,
  restartCount 1) with the new limit;
- what the API server refuses (a memory limit decrease under NotRequired, a QoS class change)
  never reaches the node;
- more CPU than the node has is ``PodResizePending`` Infeasible, more memory than is left beside
  another pod is Deferred (the kubelet's messages), and the pod runs on untouched;
- a kill -9 of the sync loop between UpdateContainerResources and its record in the allocation
  checkpoint (crash point ``syncloop:resize.after_update``) converges once it is back.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from podvisor.common.crashpoints import ENV_AT, ENV_ONCE_DIR
from tests.support.kubeapi import ApiError, KubeApi

NODE = "e2e-resize"
MI = 1 << 20


def _script(name: str) -> str:
    # the shell stays the container's process (its PID is the container's); "$$$$" is "$$"
    # after the kubelet's $(VAR) expansion
    return f"echo $$$$ > /marks/{name}.pid; trap 'exit 0' TERM; sleep 3600 & wait"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def base() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="pvresize", dir="/tmp"))
    (d / "marks").mkdir()
    (d / "kube").mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def status(api: KubeApi, name: str) -> dict[str, Any]:
    try:
        return api.store.get("pods", "default", name).get("status") or {}
    except ApiError:
        return {}


def cond(st: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions") or [] if c["type"] == ctype), {})


def named(st: dict[str, Any], name: str) -> dict[str, Any]:
    return next((c for c in st.get("containerStatuses") or [] if c["name"] == name), {})


def events(api: KubeApi, reason: str) -> list[dict[str, Any]]:
    items, _ = api.store.list("events", "default")
    return [e for e in items if e.get("reason") == reason]


def pid(marks: Path, name: str) -> int:
    text = (marks / f"{name}.pid").read_text().strip() if (marks / f"{name}.pid").exists() else ""
    return int(text) if text else 0


def cgroup_file(process: int, controller: str, file: str) -> Path:
    """The cgroup v1 file of ``process``'s cgroup in ``controller``'s hierarchy."""
    for line in Path(f"/proc/{process}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            mount = next(m.split()[1] for m in Path("/proc/self/mounts").read_text().splitlines()
                         if m.split()[2] == "cgroup" and controller in m.split()[3].split(","))
            return Path(mount) / path.lstrip("/") / file
    raise AssertionError(f"{process} has no {controller} cgroup")


def read_int(path: Path) -> int:
    return int(path.read_text().strip())


def resources(cpu: str, cpu_limit: str, mem: str, mem_limit: str) -> dict[str, Any]:
    return {"requests": {"cpu": cpu, "memory": mem},
            "limits": {"cpu": cpu_limit, "memory": mem_limit}}


def app_pod(marks: Path) -> dict[str, Any]:
    mounts = [{"name": "marks", "mountPath": "/marks"}]
    return {"metadata": {"name": "app"}, "spec": {
        "nodeName": NODE, "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 1,
        "volumes": [{"name": "marks", "hostPath": {"path": str(marks)}}],
        "containers": [
            {"name": "web", "image": "host", "command": ["sh", "-c", _script("web")],
             "volumeMounts": mounts, "resources": resources("100m", "200m", "64Mi", "128Mi"),
             "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"},
                              {"resourceName": "memory", "restartPolicy": "NotRequired"}]},
            {"name": "db", "image": "host", "command": ["sh", "-c", _script("db")],
             "volumeMounts": mounts, "resources": resources("100m", "200m", "64Mi", "128Mi"),
             "resizePolicy": [{"resourceName": "memory",
                               "restartPolicy": "RestartContainer"}]}]}}


class Kubectl:
    def __init__(self, config: Path) -> None:
        self.config = config

    def resize(self, name: str,
               containers: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
        patch = json.dumps({"spec": {"containers": containers}})
        return subprocess.run(
            ["kubectl", "--kubeconfig", str(self.config), "patch", "pod", name,
             "--subresource", "resize", "--patch", patch], capture_output=True, text=True,
            timeout=60, env={**os.environ, "HOME": str(self.config.parent)})


def start(api: KubeApi, agent: Any, base: Path) -> tuple[Any, Kubectl]:
    node_kubeconfig = api.kubeconfig(base / "node.kubeconfig", user=f"system:node:{NODE}",
                                     groups=("system:nodes",))
    admin = api.kubeconfig(base / "kube" / "config", user="admin", token="admin-token")
    handle = agent(config={
        "nodeName": NODE, "kubeconfig": str(node_kubeconfig), "readOnlyPort": 0,
        "apiWatchTimeout": "5s", "statusSweepFrequency": "1s", "apiRetryMaxDelay": "1s",
        "syncFrequency": "2s", "nodeLeaseRenewInterval": "1s", "stopPodsOnExit": True,
        "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}})
    return handle, Kubectl(admin)


def running(api: KubeApi, name: str) -> dict[str, Any] | None:
    st = status(api, name)
    ok = st.get("phase") == "Running" and cond(st, "ContainersReady").get("status") == "True"
    return st if ok else None


def dump(handle: Any, api: KubeApi) -> None:
    print(json.dumps(status(api, "app"), indent=1))
    for n in ("syncloop", "runtime"):
        lines = (handle.paths.logs_dir / f"{n}.log").read_text().splitlines()
        print(n, "\n".join(line for line in lines if "cgroup.busy" not in line)[-8000:])


def resized(api: KubeApi, container: str, limits: dict[str, str]) -> bool:
    st = status(api, "app")
    cs = named(st, container)
    return (cs.get("resources", {}).get("limits") == limits and "running" in cs.get("state", {})
            and not cond(st, "PodResizeInProgress") and not cond(st, "PodResizePending"))


@pytest.mark.timeout(300)
def test_in_place_resize_end_to_end(api: KubeApi, agent: Any, base: Path,
                                    wait_for: Callable[..., Any]) -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (Debian: kubernetes-client)")
    if os.geteuid() != 0:
        pytest.skip("container cgroups on the embedded runtime need root")
    marks = base / "marks"
    api.create_pod("default", app_pod(marks))
    handle, kubectl = start(api, agent, base)
    try:
        st = wait_for(lambda: running(api, "app"), timeout=120, message="app Running")
    except AssertionError:
        dump(handle, api)
        raise
    # Running says the containers started, not that their shells wrote their PIDs yet
    web, db = wait_for(lambda: (w := pid(marks, "web")) and (d := pid(marks, "db")) and (w, d),
                       timeout=30, message="web's and db's PIDs")
    assert named(st, "web")["allocatedResources"] == {"cpu": "100m", "memory": "64Mi"}
    assert named(st, "web")["resources"] == {"requests": {"cpu": "100m", "memory": "64Mi"},
                                             "limits": {"cpu": "200m", "memory": "128Mi"}}
    quota = cgroup_file(web, "cpu", "cpu.cfs_quota_us")
    limit = cgroup_file(web, "memory", "memory.limit_in_bytes")
    assert (read_int(quota), read_int(limit)) == (20_000, 128 * MI)

    # -- NotRequired: the same process, its cgroup rewritten ------------------------------------
    out = kubectl.resize("app", [{"name": "web", "resources": resources(
        "200m", "400m", "96Mi", "256Mi")}])
    assert out.returncode == 0, out.stderr
    try:
        wait_for(lambda: resized(api, "web", {"cpu": "400m", "memory": "256Mi"}), timeout=60,
                 message="web resized in place")
    except AssertionError:
        dump(handle, api)
        raise
    assert pid(marks, "web") == web
    assert (read_int(quota), read_int(limit)) == (40_000, 256 * MI)
    done = wait_for(lambda: events(api, "ResizeCompleted"), timeout=30,
                    message="a ResizeCompleted event")
    assert done[0]["type"] == "Normal" and done[0]["message"].startswith(
        'Pod resize completed: {"containers":[{"name":"web","resources":{"limits":'
        '{"cpu":"400m","memory":"256Mi"}')
    cs = named(status(api, "app"), "web")
    assert cs["restartCount"] == 0
    assert cs["allocatedResources"] == {"cpu": "200m", "memory": "96Mi"}
    # the pod's own cgroup (podcgroups.py): the sum of its containers' limits
    pod_limit = limit.parent.parent / "memory.limit_in_bytes"
    assert read_int(pod_limit) == (256 + 128) * MI

    # -- what the API server refuses never reaches the node -------------------------------------
    out = kubectl.resize("app", [{"name": "web", "resources": resources(
        "200m", "400m", "96Mi", "200Mi")}])
    assert out.returncode != 0
    assert "memory limits cannot be decreased unless resizePolicy is RestartContainer" in \
        out.stderr
    out = kubectl.resize("app", [  # every container requests = limits: Guaranteed
        {"name": "web", "resources": resources("400m", "400m", "256Mi", "256Mi")},
        {"name": "db", "resources": resources("200m", "200m", "128Mi", "128Mi")}])
    assert out.returncode != 0
    assert "Pod QOS Class may not change as a result of resizing" in out.stderr

    # -- RestartContainer: db restarted with its new memory limit --------------------------------
    out = kubectl.resize("app", [{"name": "db", "resources": resources(
        "100m", "200m", "64Mi", "96Mi")}])
    assert out.returncode == 0, out.stderr
    try:
        wait_for(lambda: resized(api, "db", {"cpu": "200m", "memory": "96Mi"})
                 and named(status(api, "app"), "db")["restartCount"] == 1,
                 timeout=60, message="db restarted with 96Mi")
    except AssertionError:
        dump(handle, api)
        raise
    wait_for(lambda: pid(marks, "db") not in (0, db), timeout=30, message="db's new PID")
    assert read_int(cgroup_file(pid(marks, "db"), "memory", "memory.limit_in_bytes")) == 96 * MI
    assert pid(marks, "web") == web

    # -- more CPU than the node has: Infeasible, the pod runs on --------------------------------
    out = kubectl.resize("app", [{"name": "web", "resources": resources(
        "1000", "1000", "96Mi", "256Mi")}])
    assert out.returncode == 0, out.stderr
    pending = wait_for(lambda: cond(status(api, "app"), "PodResizePending") or None,
                       timeout=60, message="PodResizePending")
    assert pending["reason"] == "Infeasible"
    assert pending["message"].startswith("Node didn't have enough capacity: cpu, requested: "
                                         "1000100, capacity: ")
    assert named(status(api, "app"), "web")["resources"]["limits"]["cpu"] == "400m"
    assert read_int(quota) == 40_000 and pid(marks, "web") == web

    # -- back to what fits: the pending condition goes -----------------------------------------
    out = kubectl.resize("app", [{"name": "web", "resources": resources(
        "200m", "300m", "96Mi", "256Mi")}])
    assert out.returncode == 0, out.stderr
    wait_for(lambda: resized(api, "web", {"cpu": "300m", "memory": "256Mi"}), timeout=60,
             message="web at 300m")
    assert read_int(quota) == 30_000 and pid(marks, "web") == web

    # -- Deferred: it fits the node, not beside another pod's requests -------------------------
    node = api.store.get("nodes", "", NODE)
    from podvisor.common.quantity import memory_bytes
    memory = memory_bytes(node["status"]["allocatable"]["memory"])
    hog = memory * 6 // 10
    api.create_pod("default", {"metadata": {"name": "hog"}, "spec": {
        "nodeName": NODE, "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": "host", "command": ["sh", "-c", _script("hog")],
                        "volumeMounts": [{"name": "marks", "mountPath": "/marks"}],
                        "resources": {"requests": {"memory": str(hog)}}}],
        "volumes": [{"name": "marks", "hostPath": {"path": str(marks)}}]}})
    wait_for(lambda: running(api, "hog"), timeout=60, message="hog Running")
    want = memory // 2 // MI * MI  # whole pages: the kernel rounds a limit down to one
    out = kubectl.resize("app", [{"name": "web", "resources": {
        "requests": {"cpu": "200m", "memory": str(want)},
        "limits": {"cpu": "300m", "memory": str(want)}}}])
    assert out.returncode == 0, out.stderr
    pending = wait_for(lambda: cond(status(api, "app"), "PodResizePending") or None,
                       timeout=60, message="PodResizePending Deferred")
    assert pending["reason"] == "Deferred"
    assert pending["message"].startswith("Node didn't have enough resource: memory, requested: ")
    # the other pod goes: the deferred resize is applied at a later sync
    api.store.delete("pods", "default", "hog", grace=0)
    try:
        wait_for(lambda: not cond(status(api, "app"), "PodResizePending")
                 and read_int(limit) == want, timeout=90, message="the deferred resize applied")
    except AssertionError:
        dump(handle, api)
        raise
    assert pid(marks, "web") == web


@pytest.mark.timeout(300)
def test_kill_9_of_the_sync_loop_mid_resize_converges(
        api: KubeApi, agent: Any, base: Path, wait_for: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (Debian: kubernetes-client)")
    if os.geteuid() != 0:
        pytest.skip("container cgroups on the embedded runtime need root")
    once = base / "once"
    once.mkdir()
    monkeypatch.setenv(ENV_AT, "syncloop:resize.after_update")
    monkeypatch.setenv(ENV_ONCE_DIR, str(once))
    marks = base / "marks"
    api.create_pod("default", app_pod(marks))
    handle, kubectl = start(api, agent, base)
    wait_for(lambda: running(api, "app"), timeout=120, message="app Running")
    web = wait_for(lambda: pid(marks, "web"), timeout=30, message="web's PID")
    pid_before = handle.status()["syncloop"]["pid"]
    out = kubectl.resize("app", [{"name": "web", "resources": resources(
        "200m", "300m", "64Mi", "192Mi")}])
    assert out.returncode == 0, out.stderr
    wait_for(lambda: (once / "syncloop.resize.after_update").exists(), timeout=60,
             message="the sync loop killed itself after UpdateContainerResources")
    try:
        wait_for(lambda: handle.status()["syncloop"].get("pid") not in (None, pid_before)
                 and resized(api, "web", {"cpu": "300m", "memory": "192Mi"}),
                 timeout=90, message="a new sync loop; the resize done")
    except AssertionError:
        dump(handle, api)
        raise
    assert pid(marks, "web") == web
    assert named(status(api, "app"), "web")["restartCount"] == 0
    assert read_int(cgroup_file(web, "memory", "memory.limit_in_bytes")) == 192 * MI
    assert read_int(cgroup_file(web, "cpu", "cpu.cfs_quota_us")) == 30_000
    state = json.loads((handle.paths.state_dir / "allocation.json").read_text())
    uid = api.store.get("pods", "default", "app")["metadata"]["uid"]
    assert state["allocated"][uid]["web"]["limits"] == {"cpu": 300, "memory": 192 * MI}
    # the pod goes: its allocation with it
    api.store.delete("pods", "default", "app", grace=0)
    wait_for(lambda: uid not in json.loads(
        (handle.paths.state_dir / "allocation.json").read_text())["allocated"],
        timeout=60, message="the allocation forgotten with the pod")
    assert not Path(f"/proc/{web}").exists()
