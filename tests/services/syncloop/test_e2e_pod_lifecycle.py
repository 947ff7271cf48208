"""The kubelet's pod lifecycle fields end to end (issue 24), on the embedded runtime, through the
stand-in API server, with a real private registry (Debian ``docker-registry`` behind basic auth,
``skopeo``) and real ``kubectl``:

- a Helm-style API pod: a sidecar (init container with ``restartPolicy: Always`` and a startup
  probe) that must be up before the next init container runs, that init container's termination
  message, an app pulled from the private registry with the credentials of its
  ServiceAccount's ``imagePullSecrets``, a ``postStart`` hook its readiness probe waits for, and
  a readiness gate: Ready only once a controller sets the gate's condition True (and it stays);
- the same shape as a static pod (its pull Secret read through the API as the kubelet does; its
  gate never set: Ready False, ReadinessGatesNotReady);
- ``kubectl debug`` adds an ephemeral container through ``pods/ephemeralcontainers``: it runs,
  shows in ``ephemeralContainerStatuses``, and the app's container is untouched;
- an update podvisor cannot honour leaves the running pod untouched, with the refusal in its
  status and an Event; a new pod it cannot run is Failed "Pod was rejected: ..." with an Event;
- termination messages (the file, and FallbackToLogsOnError) in ``state.terminated.message``;
- ``activeDeadlineSeconds`` fails the pod with DeadlineExceeded (one whose container could not
  start yet too: its container reads terminated, ContainerStatusUnknown).
"""

from __future__ import annotations

import base64
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

from tests.support.kubeapi import ApiError, KubeApi
from tests.support.lifecycle import free_port, get_pods
from tests.support.registry import registries

NODE = "e2e-life"
SLEEP = "trap 'exit 0' TERM; sleep 3600 & wait"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    server.start()
    yield server
    server.stop()


def helm_spec(image: str, marks: Path, tag: str) -> dict[str, Any]:
    """What a chart renders: a proxy sidecar, a migration, the app, a readiness gate."""
    mounts = [{"name": "marks", "mountPath": "/marks"}]
    return {
        "terminationGracePeriodSeconds": 2,
        "readinessGates": [{"conditionType": "example.com/lb-ready"}],
        "volumes": [{"name": "marks", "hostPath": {"path": str(marks)}}],
        "initContainers": [
            {"name": "proxy", "image": "host", "restartPolicy": "Always",
             "command": ["sh", "-c", f"echo up > /marks/{tag}-proxy; {SLEEP}"],
             "startupProbe": {"exec": {"command": ["cat", f"/marks/{tag}-proxy"]},
                              "periodSeconds": 1},
             "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1},
             "volumeMounts": mounts},
            {"name": "migrate", "image": "host", "volumeMounts": mounts,
             "command": ["sh", "-c", f"cat /marks/{tag}-proxy && "
                                     "echo 'schema v3' > /dev/termination-log"]}],
        "containers": [
            # pulled from the private registry (its own root filesystem)
            {"name": "app", "image": image, "command": ["sh", "-c", SLEEP]},
            # the embedded runtime's exec needs the host's setpriv: hooks and exec probes run
            # in a container of the node's root filesystem
            {"name": "web", "image": "host", "command": ["sh", "-c", SLEEP],
             "volumeMounts": mounts,
             "lifecycle": {"postStart": {"exec": {"command": [
                 "sh", "-c", f"echo started > /marks/{tag}-post-start"]}}},
             "readinessProbe": {"exec": {"command": ["cat", f"/marks/{tag}-post-start"]},
                                "periodSeconds": 1}}]}


def get(api: KubeApi, name: str) -> dict[str, Any] | None:
    try:
        return api.store.get("pods", "default", name)
    except ApiError:
        return None


def status(api: KubeApi, name: str) -> dict[str, Any]:
    return (get(api, name) or {}).get("status") or {}


def cond(st: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions") or [] if c["type"] == ctype), {})


def named(items: list[dict[str, Any]] | None, name: str) -> dict[str, Any]:
    return next((c for c in items or [] if c["name"] == name), {})


def events(api: KubeApi, reason: str) -> list[dict[str, Any]]:
    items, _ = api.store.list("events", "default")
    return [e for e in items if e.get("reason") == reason]


def static_pod(handle: Any, port: int, name: str) -> dict[str, Any]:
    for item in (get_pods(port) or {}).get("items", []):
        if item["metadata"]["name"] == f"{name}-{NODE}":
            return item  # type: ignore[no-any-return]
    return {}


def pulled_with_secret(spec: dict[str, Any]) -> bool:
    return bool(spec.get("imagePullSecrets"))


@pytest.mark.timeout(400)
def test_pod_lifecycle_fields_end_to_end(api: KubeApi, agent: Any,
                                         wait_for: Callable[..., Any], tmp_path: Path) -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (Debian: kubernetes-client)")
    base = Path(tempfile.mkdtemp(prefix="pvlife", dir="/tmp"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, base, True)
        _anon, authed = stack.enter_context(registries(base / "reg"))
        image = f"{authed.host}/private/busybox:1"
        marks = base / "marks"
        marks.mkdir()
        auth = base64.b64encode(f"{authed.user}:{authed.password}".encode()).decode()
        config = json.dumps({"auths": {authed.host: {"auth": auth}}}).encode()
        api.store.create("secrets", "default", {
            "metadata": {"name": "regcred"}, "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(config).decode()}})
        api.store.create("serviceaccounts", "default", {
            "metadata": {"name": "app"}, "imagePullSecrets": [{"name": "regcred"}]})
        helm = api.create_pod("default", {"metadata": {"name": "helm"}, "spec": {
            "nodeName": NODE, "serviceAccountName": "app", "automountServiceAccountToken": False,
            **helm_spec(image, marks, "api")}})
        assert pulled_with_secret(helm["spec"])  # the ServiceAccount plugin gave it regcred
        for name, extra in (
                ("done", {"restartPolicy": "Never", "containers": [{
                    "name": "c", "image": "host", "command": [
                        "sh", "-c", "echo 'migrated 3 tables' > /dev/termination-log"]}]}),
                ("crash", {"restartPolicy": "Never", "containers": [{
                    "name": "c", "image": "host", "terminationMessagePolicy":
                        "FallbackToLogsOnError",
                    "command": ["sh", "-c", "echo 'panic: boom'; exit 2"]}]}),
                ("deadline", {"activeDeadlineSeconds": 3, "terminationGracePeriodSeconds": 1,
                              "containers": [{"name": "c", "image": "host",
                                              "command": ["sh", "-c", SLEEP]}]}),
                ("unstarted", {"activeDeadlineSeconds": 3, "containers": [{
                    "name": "c", "image": "host", "command": ["sh", "-c", SLEEP],
                    "env": [{"name": "K", "valueFrom": {"secretKeyRef": {
                        "name": "absent", "key": "k"}}}]}]}),
                ("legacy", {"volumes": [{"name": "v", "glusterfs": {
                    "endpoints": "glusterfs-cluster", "path": "kube_vol"}}],
                    "containers": [{"name": "c", "image": "host",
                                    "command": ["sh", "-c", SLEEP]}]})):
            api.create_pod("default", {"metadata": {"name": name}, "spec": {
                "nodeName": NODE, "automountServiceAccountToken": False, **extra}})
        manifests = base / "manifests"
        manifests.mkdir()
        static = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "helm-static"},
                  "spec": {"imagePullSecrets": [{"name": "regcred"}],
                           **helm_spec(image, marks, "static")}}
        (manifests / "helm.json").write_text(json.dumps(static))
        node_kubeconfig = api.kubeconfig(base / "node.kubeconfig", user=f"system:node:{NODE}",
                                         groups=("system:nodes",))
        (base / "kube").mkdir()
        admin = api.kubeconfig(base / "kube" / "config", user="admin", token="admin-token")
        port = free_port()
        handle = agent(config={
            "nodeName": NODE, "kubeconfig": str(node_kubeconfig), "readOnlyPort": port,
            "staticPodPath": str(manifests), "fileCheckFrequency": "2s",
            "apiWatchTimeout": "5s", "statusSweepFrequency": "1s", "apiRetryMaxDelay": "1s",
            "nodeLeaseRenewInterval": "1s", "stopPodsOnExit": True,
            "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}})

        # -- the Helm-style API pod: sidecar first, then the migration, then the app ----------
        def running_unready() -> dict[str, Any] | None:
            st = status(api, "helm")
            ok = st.get("phase") == "Running" and \
                cond(st, "ContainersReady").get("status") == "True"
            return st if ok else None

        try:
            st = wait_for(running_unready, timeout=180,
                          message="helm Running, its containers ready")
        except AssertionError:
            print(json.dumps(status(api, "helm"), indent=1))
            for n in ("syncloop", "prober", "source-api", "runtime"):
                print(n, (handle.paths.logs_dir / f"{n}.log").read_text()[-6000:])
            raise
        proxy = named(st["initContainerStatuses"], "proxy")
        migrate = named(st["initContainerStatuses"], "migrate")
        assert "running" in proxy["state"] and proxy["started"] and proxy["ready"]
        assert migrate["state"]["terminated"]["exitCode"] == 0
        assert migrate["state"]["terminated"]["message"] == "schema v3\n"
        assert migrate["restartCount"] == 0  # it ran once, after the sidecar was up
        web = named(st["containerStatuses"], "web")
        assert web["ready"] and web["restartCount"] == 0  # its postStart ran: probe passes
        assert (marks / "api-post-start").read_text() == "started\n"
        assert cond(st, "Initialized")["status"] == "True"
        ready = cond(st, "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "ReadinessGatesNotReady")
        assert ready["message"] == ('corresponding condition of pod readiness gate '
                                    '"example.com/lb-ready" does not exist.')
        assert not events(api, "FailedToRetrieveImagePullSecret")
        # the load balancer controller sets the gate: Ready, and the condition stays
        api.store.update("pods", "default", "helm", lambda p: {**p, "status": {
            **p["status"], "conditions": [*p["status"]["conditions"], {
                "type": "example.com/lb-ready", "status": "True",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}, subresource="status")
        wait_for(lambda: cond(status(api, "helm"), "Ready").get("status") == "True",
                 timeout=60, message="helm Ready once its gate is True")
        assert cond(status(api, "helm"), "example.com/lb-ready")["status"] == "True"
        app = named(status(api, "helm")["containerStatuses"], "app")

        # -- kubectl debug: an ephemeral container beside the app, which is not disturbed -----
        out = subprocess.run(
            ["kubectl", "--kubeconfig", str(admin), "debug", "helm", "--image=host",
             "--target=app", "--container=dbg", "--", "sh", "-c",
             "echo debugging; sleep 3600"], capture_output=True, text=True, timeout=60,
            env={**os.environ, "HOME": str(admin.parent)})
        assert out.returncode == 0, out.stderr

        def debugging() -> dict[str, Any] | None:
            dbg = named(status(api, "helm").get("ephemeralContainerStatuses"), "dbg")
            return dbg if "running" in dbg.get("state", {}) else None

        dbg = wait_for(debugging, timeout=60, message="the debug container running")
        assert dbg["containerID"].startswith("embedded://")
        now = named(status(api, "helm")["containerStatuses"], "app")
        assert (now["containerID"], now["restartCount"]) == (app["containerID"], 0)
        assert any(e["name"] == "dbg" for e in get(api, "helm")["spec"]["ephemeralContainers"])

        # -- an update it cannot honour: refused, the pod runs on untouched --------------------
        def add_glusterfs(p: dict[str, Any]) -> dict[str, Any]:
            p["spec"]["volumes"] = [*p["spec"]["volumes"], {"name": "v", "glusterfs": {
                "endpoints": "glusterfs-cluster", "path": "kube_vol"}}]
            return p

        api.store.update("pods", "default", "helm", add_glusterfs)
        wait_for(lambda: status(api, "helm").get("reason") == "UnsupportedPodUpdate",
                 timeout=60, message="the refused update in helm's status")
        st = status(api, "helm")
        assert "spec.volumes[1].glusterfs" in st["message"] and st["phase"] == "Running"
        assert events(api, "UnsupportedPodUpdate")
        now = named(st["containerStatuses"], "app")
        assert (now["containerID"], now["restartCount"]) == (app["containerID"], 0)
        assert "running" in named(st["ephemeralContainerStatuses"], "dbg")["state"]

        # -- a new pod it cannot run: rejected as the kubelet's admission does ----------------
        st = wait_for(lambda: (s := status(api, "legacy")).get("phase") == "Failed" and s,
                      timeout=60, message="legacy Failed")
        assert st["reason"] == "UnsupportedPodSpec"
        assert st["message"].startswith("Pod was rejected: spec.volumes[0].glusterfs:")
        assert any("glusterfs" in e["message"] for e in events(api, "UnsupportedPodSpec"))

        # -- termination messages ---------------------------------------------------------------
        def terminated(name: str) -> dict[str, Any] | None:
            c = named(status(api, name).get("containerStatuses"), "c")
            return c.get("state", {}).get("terminated")

        done = wait_for(lambda: terminated("done"), timeout=60, message="done terminated")
        assert done["message"] == "migrated 3 tables\n"
        crash = wait_for(lambda: terminated("crash"), timeout=60, message="crash terminated")
        assert (crash["exitCode"], crash["message"]) == (2, "panic: boom\n")

        # -- activeDeadlineSeconds --------------------------------------------------------------
        st = wait_for(lambda: (s := status(api, "deadline")).get("phase") == "Failed" and s,
                      timeout=60, message="deadline Failed")
        assert (st["reason"], st["message"]) == (
            "DeadlineExceeded", "Pod was active on the node longer than the specified deadline")
        assert events(api, "DeadlineExceeded")
        wait_for(lambda: terminated("deadline") is not None, timeout=30,
                 message="its container stopped")
        # its deadline before its container could start (its Secret is missing): terminated
        # all the same, as the kubelet's TerminatePod reports a container it cannot find
        gone = wait_for(lambda: status(api, "unstarted").get("phase") == "Failed"
                        and terminated("unstarted"), timeout=60, message="unstarted terminated")
        assert (gone["reason"], gone["exitCode"]) == ("ContainerStatusUnknown", 137)
        assert gone["message"] == "The container could not be located when the pod was terminated"

        # -- the static pod: the same chart, its gate never set ---------------------------------
        def static_up() -> dict[str, Any] | None:
            item = static_pod(handle, port, "helm-static")
            st = item.get("status") or {}
            return st if named(st.get("containerStatuses"), "web").get("ready") and \
                named(st.get("containerStatuses"), "app").get("ready") else None

        st = wait_for(static_up, timeout=120, message="the static pod's containers ready")
        assert named(st["initContainerStatuses"], "migrate")["state"]["terminated"][
            "message"] == "schema v3\n"
        assert named(st["initContainerStatuses"], "proxy")["started"]
        assert (cond(st, "Ready")["status"], cond(st, "Ready")["reason"]) == (
            "False", "ReadinessGatesNotReady")
