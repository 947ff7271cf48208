"""An API pod on containerd, against the stand-in API server: it runs (the busybox test image,
host network), its status reaches Running in the API with containerd:// container IDs and the
API-backed data (a ConfigMap env var, the projected service-account volume) is there; deleting it
with a 5 s grace stops it and removes it from the API. Skipped without containerd."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from podvisor.services.cri import CriError, new_runtime_client
from podvisor.services.syncloop import labels as L
from tests.support.containerd import ContainerdHandle, containerd_or_skip, remove_pod_cgroup
from tests.support.kubeapi import ApiError, KubeApi
from tests.support.lifecycle import free_port

pytestmark = pytest.mark.containerd
NODE = "e2e-ctrd"


@pytest.fixture(scope="module")
def containerd() -> ContainerdHandle:
    return containerd_or_skip()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    server.start()
    yield server
    server.stop()


@pytest.mark.timeout(170)
def test_api_pod_on_containerd(api: KubeApi, agent: Any, containerd: ContainerdHandle,
                               wait_for: Callable[..., Any], tmp_path: Path) -> None:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", user=f"system:node:{NODE}",
                                groups=("system:nodes",))
    api.store.create("configmaps", "default", {"metadata": {"name": "app"},
                                               "data": {"greeting": "hello"}})
    created = api.create_pod("default", {"metadata": {"name": "web"}, "spec": {
        "nodeName": NODE, "hostNetwork": True, "terminationGracePeriodSeconds": 30,
        "containers": [{"name": "c", "image": containerd.image,
                        "imagePullPolicy": "IfNotPresent",
                        "env": [{"name": "GREETING", "valueFrom": {"configMapKeyRef": {
                            "name": "app", "key": "greeting"}}}],
                        "command": ["sh", "-c", "trap 'exit 0' TERM; "
                                    "cat /var/run/secrets/kubernetes.io/serviceaccount/token "
                                    ">/dev/null && echo $GREETING; sleep 3600 & wait"]}]}})
    uid = created["metadata"]["uid"]
    cgroup_root = f"/podvisor-test-{secrets.token_hex(4)}"
    cri = new_runtime_client(containerd.endpoint, timeout=30.0)
    try:
        agent(config={"nodeName": NODE, "kubeconfig": str(kubeconfig),
                      "runtimeEndpoint": containerd.endpoint, "cgroupRoot": cgroup_root,
                      "readOnlyPort": free_port(), "stopPodsOnExit": True,
                      "statusSweepFrequency": "1s",
                      "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}})

        def running() -> dict[str, Any] | None:
            st = api.store.get("pods", "default", "web").get("status", {})
            cs = st.get("containerStatuses") or []
            return st if st.get("phase") == "Running" and cs and \
                "running" in cs[0]["state"] else None

        status = wait_for(running, timeout=120, message="web Running in the API")
        assert status["containerStatuses"][0]["containerID"].startswith("containerd://")
        assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
        api.store.delete("pods", "default", "web", grace=5)

        def gone() -> bool:
            try:
                api.store.get("pods", "default", "web")
            except ApiError:
                return True
            return False

        wait_for(gone, timeout=60, message="web removed from the API")
    finally:
        for sandbox in cri.list_pod_sandbox():
            if sandbox.labels.get(L.POD_UID) == uid:
                try:
                    cri.stop_pod_sandbox(sandbox.id)
                    cri.remove_pod_sandbox(sandbox.id)
                except CriError:
                    pass
        cri.close()
        remove_pod_cgroup(cgroup_root)
