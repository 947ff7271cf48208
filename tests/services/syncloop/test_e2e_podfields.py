"""The last Pod fields of issue 24 end to end, through the stand-in API server, on both
runtimes (``pod_runtime``):

- ``tcpSocket`` lifecycle handlers: the pod runs; its postStart fails every start as the
  kubelet's handler runner fails it (FailedPostStartHook, the container killed and restarted);
  its preStop fails when the pod is deleted (FailedPreStopHook with the kubelet's message) and
  the container is stopped all the same;
- the downward API's ``resourceFieldRef`` of ephemeral-storage (a limit, and the node's
  allocatable for none) and hugepages, in env and in a downwardAPI volume;
- ``recursiveReadOnly``: on the embedded runtime (which supports it) Enabled makes a submount
  under the volume read-only in the container, IfPossible too, while a plain read-only mount
  leaves it writable; containerd 1.6 lists no runtime handlers, so, as the kubelet, Enabled
  fails the container (CreateContainerConfigError) and IfPossible is a plain read-only mount;
- ``runtimeClassName``: a class naming the runtime's handler (the embedded runtime's
  ``podvisor``, containerd's ``runc``) runs the pod; a
  missing class holds it ContainerCreating with FailedCreatePodSandBox until the class is
  created; a class naming a handler the runtime lacks fails with the runtime's error.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from podvisor.services.runtime.monitor import mount_setattr_works
from tests.support.kubeapi import ApiError, KubeApi

NODE = "e2e-fields"
SLEEP = "trap 'exit 0' TERM; sleep 3600 & wait"
TCP_MESSAGE = ("Cannot run handler: invalid handler: &LifecycleHandler{Exec:nil,HTTPGet:nil,"
               "TCPSocket:&TCPSocketAction{Port:{0 8080 },Host:,},Sleep:nil,}")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    server.start()
    yield server
    server.stop()


@contextlib.contextmanager
def tmpfs_under(base: Path) -> Iterator[Path]:
    """``base/vol`` with a tmpfs mounted on ``base/vol/sub`` (unmounted after)."""
    vol = base / "vol"
    (vol / "sub").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "pvrro", str(vol / "sub")],
                   check=True)
    try:
        yield vol
    finally:
        subprocess.run(["umount", "-l", str(vol / "sub")], check=False)


def status(api: KubeApi, name: str) -> dict[str, Any]:
    try:
        return api.store.get("pods", "default", name).get("status") or {}
    except ApiError:
        return {}


def named(items: list[dict[str, Any]] | None, name: str) -> dict[str, Any]:
    return next((c for c in items or [] if c["name"] == name), {})


def events(api: KubeApi, reason: str, pod: str = "") -> list[dict[str, Any]]:
    items, _ = api.store.list("events", "default")
    return [e for e in items if e.get("reason") == reason and
            (not pod or e.get("involvedObject", {}).get("name") == pod)]


def writer(name: str, image: str, at: str, mounts: list[dict[str, Any]], *targets: str,
           ) -> dict[str, Any]:
    """A container that tries to write each target and says so in <at>/out/<name>."""
    tries = "; ".join(f"if echo x 2>/dev/null > {at}{t}; then echo {t}:writable; "
                      f"else echo {t}:refused; fi" for t in targets)
    return {"name": name, "image": image, "volumeMounts": mounts,
            "command": ["sh", "-c", f"({tries}) > {at}/out/{name}.tmp; "
                                    f"mv {at}/out/{name}.tmp {at}/out/{name}; {SLEEP}"]}


def pods(image: str, out: Path, vol: Path, at: str = "") -> dict[str, dict[str, Any]]:
    """``at``: where the mounts go in the container (the embedded runtime's ``host`` image
    is the node's root: its mount points are made there, so under the test's folder)."""
    out_mount = {"name": "out", "mountPath": f"{at}/out"}
    volumes = [{"name": "out", "hostPath": {"path": str(out)}},
               {"name": "vol", "hostPath": {"path": str(vol)}}]
    ro = [{"name": "vol", "mountPath": f"{at}/rro", "readOnly": True,
           "recursiveReadOnly": "Enabled"},
          {"name": "vol", "mountPath": f"{at}/maybe", "readOnly": True,
           "recursiveReadOnly": "IfPossible"},
          {"name": "vol", "mountPath": f"{at}/plain", "readOnly": True}]
    env = [{"name": n, "valueFrom": {"resourceFieldRef": ref}} for n, ref in (
        ("DISK_MI", {"resource": "limits.ephemeral-storage", "divisor": "1Mi"}),
        ("DISK_REQ", {"resource": "requests.ephemeral-storage"}),
        ("NODE_DISK", {"resource": "limits.ephemeral-storage", "containerName": "other"}),
        ("PAGES", {"resource": "requests.hugepages-2Mi"}))]
    dump = f"echo $DISK_MI $DISK_REQ $NODE_DISK $PAGES $(cat {at}/info/disk) > {at}/out/e; " \
           f"mv {at}/out/e {at}/out/env; {SLEEP}"
    return {
        # two pods: the failing postStart's restarts would use up the hooks pod's share of
        # the event spam filter (25 per object), as they would with the kubelet
        "hooks": {"containers": [
            {"name": "start", "image": image, "command": ["sh", "-c", SLEEP],
             "lifecycle": {"postStart": {"tcpSocket": {"port": 8080}}}}]},
        "stopper": {"terminationGracePeriodSeconds": 5, "containers": [
            {"name": "stop", "image": image, "command": ["sh", "-c", SLEEP],
             "lifecycle": {"preStop": {"tcpSocket": {"port": 8080}}}}]},
        "downward": {"volumes": [{"name": "out", "hostPath": {"path": str(out)}},
                                 {"name": "info", "downwardAPI": {"items": [{
                                     "path": "disk", "resourceFieldRef": {
                                         "containerName": "c", "divisor": "1Ki",
                                         "resource": "limits.ephemeral-storage"}}]}}],
                     "containers": [
                         {"name": "c", "image": image, "env": env, "command": ["sh", "-c", dump],
                          "resources": {"limits": {"ephemeral-storage": "64Mi"},
                                        "requests": {"ephemeral-storage": "1000"}},
                          "volumeMounts": [out_mount, {"name": "info",
                                                       "mountPath": f"{at}/info"}]},
                         {"name": "other", "image": image, "command": ["sh", "-c", SLEEP]}]},
        "rro": {"volumes": volumes, "containers": [writer(
            "rro", image, at, [out_mount, *ro], "/rro/top", "/rro/sub/a", "/maybe/sub/b",
            "/plain/sub/c")]},
    }


def create(api: KubeApi, name: str, spec: dict[str, Any]) -> None:
    api.create_pod("default", {"metadata": {"name": name}, "spec": {
        "nodeName": NODE, "automountServiceAccountToken": False, **spec}})


def run_agent(api: KubeApi, agent: Any, base: Path, **extra: Any) -> Any:
    kubeconfig = api.kubeconfig(base / "node.kubeconfig", user=f"system:node:{NODE}",
                                groups=("system:nodes",))
    return agent(config={
        "nodeName": NODE, "kubeconfig": str(kubeconfig), "apiWatchTimeout": "5s",
        "statusSweepFrequency": "1s", "apiRetryMaxDelay": "1s", "nodeLeaseRenewInterval": "1s",
        "stopPodsOnExit": True,
        "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}, **extra})


def check_hooks_and_downward(api: KubeApi, wait_for: Callable[..., Any], out: Path,
                             handle: Any) -> None:
    # -- tcpSocket hooks: postStart fails at every start, the container is killed --------------
    def hook_failed_twice() -> dict[str, Any] | None:
        c = named(status(api, "hooks").get("containerStatuses"), "start")
        return c if c.get("restartCount", 0) >= 1 else None

    try:
        wait_for(hook_failed_twice, timeout=120, message="start's postStart failed, restarted")
    except AssertionError:
        print(json.dumps(status(api, "hooks"), indent=1))
        print((handle.paths.logs_dir / "syncloop.log").read_text()[-6000:])
        raise
    failed = wait_for(lambda: events(api, "FailedPostStartHook", "hooks"), timeout=60,
                      message="FailedPostStartHook")
    assert failed[0]["message"] == "PostStartHook failed"
    assert failed[0]["involvedObject"]["fieldPath"] == "spec.containers{start}"
    stop = wait_for(lambda: named(status(api, "stopper").get("containerStatuses"), "stop"),
                    timeout=60, message="stopper's status")
    assert stop["restartCount"] == 0

    # -- resourceFieldRef of ephemeral-storage and hugepages -----------------------------------
    env = wait_for(lambda: (out / "env").exists() and (out / "env").read_text().split(),
                   timeout=120, message="the downward pod's values")
    disk_mi, disk_req, node_disk, pages, file_ki = env
    assert (disk_mi, disk_req, pages, file_ki) == ("64", "1000", "0", str(64 * 1024))
    st = os.statvfs(handle.config["rootDir"])
    capacity = st.f_blocks * st.f_frsize
    assert 0 < int(node_disk) <= capacity  # allocatable: capacity less the eviction reserve
    assert int(node_disk) >= capacity * 0.85  # the default nodefs.available reserve is 10 %

    # -- preStop tcpSocket: fails when the pod is deleted, the stop goes on --------------------
    wait_for(lambda: "running" in named(status(api, "stopper").get("containerStatuses"),
                                        "stop").get("state", {}),
             timeout=60, message="stopper running")
    api.store.delete("pods", "default", "stopper", grace=5)
    try:
        wait_for(lambda: events(api, "FailedPreStopHook", "stopper"), timeout=60,
                 message="FailedPreStopHook")
    except AssertionError:  # what the sync loop did with it, and the events the API has
        print("\n".join(line for line in (handle.paths.logs_dir / "syncloop.log").read_text()
                        .splitlines() if "prestop" in line or "stopper" in line)[-6000:])
        print([(e.get("reason"), e.get("involvedObject", {}).get("name"), e.get("message"))
               for e in api.store.list("events", "default")[0]][-40:])
        raise
    [stopped] = events(api, "FailedPreStopHook", "stopper")
    assert stopped["message"] == TCP_MESSAGE
    assert stopped["involvedObject"]["fieldPath"] == "spec.containers{stop}"
    wait_for(lambda: not status(api, "stopper"), timeout=60,
             message="stopper stopped and gone from the API (the stop went on)")


def check_recursive_read_only(api: KubeApi, wait_for: Callable[..., Any], out: Path,
                              vol: Path, embedded: bool) -> None:
    if embedded and mount_setattr_works():  # the runtime supports it: the submount too
        said = wait_for(lambda: (out / "rro").exists() and (out / "rro").read_text().split(),
                        timeout=120, message="the rro pod's writes")
        assert said == ["/rro/top:refused", "/rro/sub/a:refused", "/maybe/sub/b:refused",
                        "/plain/sub/c:writable"]
        assert (vol / "sub" / "c").read_text() == "x\n"
        return

    # containerd 1.6 lists no handlers (nor does the embedded runtime's "" on a kernel
    # without mount_setattr): Enabled fails the container, IfPossible is plain
    def config_error() -> dict[str, Any] | None:
        c = named(status(api, "rro").get("containerStatuses"), "rro")
        waiting = c.get("state", {}).get("waiting", {})
        return waiting if waiting.get("reason") == "CreateContainerConfigError" else None

    waiting = wait_for(config_error, timeout=120, message="rro CreateContainerConfigError")
    assert waiting["message"] == (
        'failed to resolve recursive read-only mode: volume "vol" requested recursive '
        "read-only mode, but it is not supported by the runtime")
    said = wait_for(lambda: (out / "maybe").exists() and (out / "maybe").read_text().split(),
                    timeout=120, message="the maybe pod's writes")
    assert said == ["/maybe/top:refused", "/maybe/sub/b:writable", "/plain/sub/c:writable"]


def check_runtime_classes(api: KubeApi, wait_for: Callable[..., Any], handler: str) -> None:
    wait_for(lambda: status(api, "classy").get("phase") == "Running", timeout=90,
             message=f"classy Running (its class names the runtime's {handler} handler)")
    wait_for(lambda: any('no runtime for "gvisor" is configured' in e["message"]
                         for e in events(api, "FailedCreatePodSandBox", "nohandler")),
             timeout=60, message="nohandler's FailedCreatePodSandBox")
    assert status(api, "nohandler").get("phase") == "Pending"
    missing = 'Failed to create pod sandbox: runtimeclass.node.k8s.io "later" not found'
    wait_for(lambda: any(e["message"] == missing
                         for e in events(api, "FailedCreatePodSandBox", "missing")),
             timeout=60, message="missing's FailedCreatePodSandBox")
    waiting = named(status(api, "missing").get("containerStatuses"), "c")
    assert waiting.get("state", {}).get("waiting", {}).get("reason") == "ContainerCreating"
    # the class created: the retry runs the pod (the informer saw it)
    api.store.create("runtimeclasses", "", {"metadata": {"name": "later"}, "handler": handler})
    wait_for(lambda: status(api, "missing").get("phase") == "Running", timeout=90,
             message="missing Running once its class exists")


@pytest.mark.skipif(os.geteuid() != 0, reason="tmpfs and bind mounts need root")
@pytest.mark.timeout(400)
def test_pod_fields(pod_runtime: dict[str, Any], api: KubeApi, agent: Any,
                    wait_for: Callable[..., Any]) -> None:
    image = pod_runtime["image"]
    embedded = image == "host"
    handler = "podvisor" if embedded else "runc"
    base = Path(tempfile.mkdtemp(prefix="pvfields", dir="/tmp"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, base, True)
        vol = stack.enter_context(tmpfs_under(base))
        out = base / "out"
        out.mkdir()
        at = str(base / "ctr") if embedded else ""
        specs = pods(image, out, vol, at)
        for name, spec in specs.items():
            create(api, name, spec)
        if not (embedded and mount_setattr_works()):
            create(api, "maybe", {"volumes": specs["rro"]["volumes"], "containers": [writer(
                "maybe", image, at,
                [{"name": "out", "mountPath": f"{at}/out"},
                 *specs["rro"]["containers"][0]["volumeMounts"][2:]],
                "/maybe/top", "/maybe/sub/b", "/plain/sub/c")]})
        for name, cls_handler in (("this-runtime", handler), ("sandboxed", "gvisor")):
            api.store.create("runtimeclasses", "", {"metadata": {"name": name},
                                                    "handler": cls_handler})
        for name, cls in (("classy", "this-runtime"), ("missing", "later"),
                          ("nohandler", "sandboxed")):
            create(api, name, {"runtimeClassName": cls, "containers": [
                {"name": "c", "image": image, "command": ["sh", "-c", SLEEP]}]})
        handle = run_agent(api, agent, base, **pod_runtime["config"])

        check_hooks_and_downward(api, wait_for, out, handle)
        check_recursive_read_only(api, wait_for, out, vol, embedded)
        check_runtime_classes(api, wait_for, handler)
        assert handle.stop() == 0
