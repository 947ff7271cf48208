"""The last Pod fields of issue 24 on containerd (1.6 here), through the stand-in API server: the
``tcpSocket`` hooks and the downward API's ephemeral-storage and hugepages as on the embedded
runtime (``test_e2e_podfields.py``); ``recursiveReadOnly``: containerd 1.6 lists no runtime
handlers, so, as the kubelet, Enabled fails the container (CreateContainerConfigError with the
kubelet's message) and IfPossible is a plain read-only mount (the submount stays writable);
``runtimeClassName``: a class naming containerd's ``runc`` handler runs the pod, one naming a
handler it lacks fails the sandbox with containerd's error, a missing class holds the pod until
it is created. Skipped with the reason when no containerd is available."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from podvisor.services.cri import new_runtime_client
from tests.services.syncloop.test_e2e_containerd_pods import clean
from tests.services.syncloop.test_e2e_podfields import (
    SLEEP,
    check_hooks_and_downward,
    create,
    events,
    named,
    pods,
    run_agent,
    status,
    tmpfs_under,
    writer,
)
from tests.support.containerd import ContainerdHandle, containerd_or_skip
from tests.support.kubeapi import KubeApi

pytestmark = pytest.mark.containerd


@pytest.fixture(scope="module")
def containerd() -> ContainerdHandle:
    return containerd_or_skip()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    server.start()
    yield server
    server.stop()


@pytest.mark.timeout(400)
def test_pod_fields_on_containerd(api: KubeApi, agent: Any, containerd: ContainerdHandle,
                                  wait_for: Callable[..., Any]) -> None:
    image = containerd.image
    base = Path(tempfile.mkdtemp(prefix="pvctfields", dir="/tmp"))
    cri = new_runtime_client(containerd.endpoint, timeout=30.0)
    cgroup_root = f"/podvisor-test-{secrets.token_hex(4)}"
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, base, True)
        stack.callback(cri.close)
        vol = stack.enter_context(tmpfs_under(base))
        out = base / "out"
        out.mkdir()
        specs = pods(image, out, vol)
        for name, spec in specs.items():
            create(api, name, spec)
        out_mount = {"name": "out", "mountPath": "/out"}
        create(api, "maybe", {"volumes": specs["rro"]["volumes"], "containers": [writer(
            "maybe", image, "", [out_mount, *specs["rro"]["containers"][0]["volumeMounts"][2:]],
            "/maybe/top", "/maybe/sub/b", "/plain/sub/c")]})
        api.store.create("runtimeclasses", "", {"metadata": {"name": "runc-class"},
                                                "handler": "runc"})
        api.store.create("runtimeclasses", "", {"metadata": {"name": "sandboxed"},
                                                "handler": "gvisor"})
        for name, cls in (("classy", "runc-class"), ("missing", "later"),
                          ("nohandler", "sandboxed")):
            create(api, name, {"runtimeClassName": cls, "containers": [
                {"name": "c", "image": image, "command": ["sh", "-c", SLEEP]}]})
        uids = {p["metadata"]["uid"] for p in api.store.list("pods", "default")[0]}
        stack.callback(clean, cri, cgroup_root, uids)
        handle = run_agent(api, agent, base, runtimeEndpoint=containerd.endpoint,
                           cgroupRoot=cgroup_root)

        check_hooks_and_downward(api, wait_for, out, handle)

        # -- recursiveReadOnly: containerd 1.6 lists no handlers ------------------------------
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

        # -- runtimeClassName ------------------------------------------------------------------
        wait_for(lambda: status(api, "classy").get("phase") == "Running", timeout=90,
                 message="classy Running (its class names containerd's runc handler)")
        wait_for(lambda: any('no runtime for "gvisor" is configured' in e["message"]
                             for e in events(api, "FailedCreatePodSandBox", "nohandler")),
                 timeout=60, message="nohandler's FailedCreatePodSandBox")
        missing = 'Failed to create pod sandbox: runtimeclass.node.k8s.io "later" not found'
        wait_for(lambda: any(e["message"] == missing
                             for e in events(api, "FailedCreatePodSandBox", "missing")),
                 timeout=60, message="missing's FailedCreatePodSandBox")
        api.store.create("runtimeclasses", "", {"metadata": {"name": "later"},
                                                "handler": "runc"})
        wait_for(lambda: status(api, "missing").get("phase") == "Running", timeout=90,
                 message="missing Running once its class exists")
        assert handle.stop() == 0
