"""The kubelet's pod lifecycle fields on containerd (issue 24), static pods of the busybox image:
a sidecar whose startup probe gates the next init container, that init container's
termination message (read from the file containerd mounted), postStart before the app's
readiness, an ephemeral container added to the running pod (PID namespace TARGET of the app;
the app untouched), and activeDeadlineSeconds. Skipped with the reason when no containerd is
available (tests/runtime/containerd.py)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from podvisor.services.cri import new_runtime_client
from tests.services.syncloop.test_e2e_containerd_pods import clean
from tests.support.containerd import ContainerdHandle, containerd_or_skip
from tests.support.lifecycle import agent_config, free_port, get_pods

pytestmark = pytest.mark.containerd
SLEEP = "trap 'exit 0' TERM; sleep 3600 & wait"
UID = "6f1c1d2e-0000-4000-8000-00000000c0de"  # fixed: an edit of the file is an update


@pytest.fixture(scope="module")
def containerd() -> ContainerdHandle:
    return containerd_or_skip()


def life(image: str, debug: bool = False) -> dict[str, Any]:
    shared = [{"name": "shared", "mountPath": "/shared"}]
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 2,
        "volumes": [{"name": "shared", "emptyDir": {}}],
        "initContainers": [
            {"name": "proxy", "image": image, "restartPolicy": "Always",
             "command": ["sh", "-c", f"touch /shared/up; {SLEEP}"], "volumeMounts": shared,
             "startupProbe": {"exec": {"command": ["test", "-f", "/shared/up"]},
                              "periodSeconds": 1}},
            {"name": "migrate", "image": image, "volumeMounts": shared,
             "command": ["sh", "-c", "test -f /shared/up && "
                                     "echo 'schema v3' > /dev/termination-log"]}],
        "containers": [
            {"name": "app", "image": image, "command": ["sh", "-c", SLEEP],
             "lifecycle": {"postStart": {"exec": {"command": [
                 "sh", "-c", "echo started > /tmp/post-start"]}}},
             "readinessProbe": {"exec": {"command": ["cat", "/tmp/post-start"]},
                                "periodSeconds": 1}}]}
    if debug:
        spec["ephemeralContainers"] = [{"name": "dbg", "image": image,
                                        "targetContainerName": "app",
                                        "command": ["sh", "-c", SLEEP]}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "life", "uid": UID},
            "spec": spec}


def named(items: list[dict[str, Any]] | None, name: str) -> dict[str, Any]:
    return next((c for c in items or [] if c["name"] == name), {})


def status(port: int, name: str) -> dict[str, Any]:
    for item in (get_pods(port) or {}).get("items", []):
        if item["metadata"]["name"] == f"{name}-e2e":
            return item.get("status") or {}  # type: ignore[no-any-return]
    return {}


@pytest.mark.timeout(240)
def test_lifecycle_fields_on_containerd(agent: Any, containerd: ContainerdHandle,
                                        manifests: Path, wait_for: Any) -> None:
    image = containerd.image
    (manifests / "life.json").write_text(json.dumps(life(image)))
    (manifests / "deadline.json").write_text(json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "deadline"}, "spec": {
            "activeDeadlineSeconds": 3, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": image, "command": ["sh", "-c", SLEEP]}]}}))
    port = free_port()
    cri = new_runtime_client(containerd.endpoint, timeout=30.0)
    cgroup_root = f"/podvisor-test-{secrets.token_hex(4)}"
    uids = {UID}
    try:
        handle = agent(config=agent_config(manifests, port, runtimeEndpoint=containerd.endpoint,
                                           stopPodsOnExit=True, cgroupRoot=cgroup_root))
        uids |= {p["metadata"]["uid"] for p in (get_pods(port) or {}).get("items", [])}

        def ready() -> dict[str, Any] | None:
            st = status(port, "life")
            app = named(st.get("containerStatuses"), "app")
            return st if app.get("ready") else None

        st = wait_for(ready, 150.0, 0.2, "life's app ready (its postStart ran)")
        proxy = named(st["initContainerStatuses"], "proxy")
        migrate = named(st["initContainerStatuses"], "migrate")
        assert "running" in proxy["state"] and proxy["started"]
        assert migrate["state"]["terminated"]["message"] == "schema v3\n"
        assert migrate["restartCount"] == 0 and st["phase"] == "Running"
        app = named(st["containerStatuses"], "app")
        assert app["containerID"].startswith("containerd://")
        # an ephemeral container added to the running pod: runs, the app is untouched
        (manifests / "life.json").write_text(json.dumps(life(image, debug=True)))

        def debugging() -> dict[str, Any] | None:
            s = status(port, "life")
            dbg = named(s.get("ephemeralContainerStatuses"), "dbg")
            return s if "running" in dbg.get("state", {}) else None

        st = wait_for(debugging, 60.0, 0.2, "the ephemeral container running")
        now = named(st["containerStatuses"], "app")
        assert (now["containerID"], now["restartCount"]) == (app["containerID"], 0)
        # activeDeadlineSeconds: Failed, DeadlineExceeded, its container stopped
        st = wait_for(lambda: (s := status(port, "deadline")).get("phase") == "Failed" and s,
                      60.0, 0.2, "deadline Failed")
        assert st["reason"] == "DeadlineExceeded"
        wait_for(lambda: "terminated" in named(status(port, "deadline").get(
            "containerStatuses"), "c").get("state", {}), 30.0, 0.2, "its container stopped")
        uids |= {p["metadata"]["uid"] for p in (get_pods(port) or {}).get("items", [])}
        assert handle.stop() == 0
    finally:
        clean(cri, cgroup_root, uids)
        cri.close()
