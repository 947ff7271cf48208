"""kubectl through the stand-in API server and podvisor's main port to containerd's own
streaming server (the embedded runtime's path is in test_e2e_kubectl.py, whose helpers this
module shares). Skipped without containerd."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import requests

from podvisor.services.cri import CriError, new_runtime_client
from podvisor.services.syncloop import labels as L
from tests.services.server.test_e2e_kubectl import NODE, SPDY, Cluster, _running, _serving
from tests.support.containerd import ContainerdHandle, containerd_or_skip, remove_pod_cgroup
from tests.support.kubeapi import KubeApi
from tests.support.lifecycle import free_port

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None,
                                reason="kubectl is not installed (Debian: kubernetes-client)")


@pytest.fixture(scope="module")
def containerd() -> ContainerdHandle:
    return containerd_or_skip()


@pytest.mark.containerd
@pytest.mark.timeout(240)
def test_kubectl_on_containerd(agent: Any, wait_for: Any, tmp_path: Path,
                               containerd: ContainerdHandle) -> None:
    """The same path with containerd behind the main port (its own streaming server): kubectl
    exec over SPDY (output, exit code, stdin) and port-forward to busybox httpd in a
    host-network pod."""
    ctrd = containerd
    api = KubeApi(tmp_path / "kubeapi").start()
    cgroup_root = f"/podvisor-test-{os.getpid()}-kc"
    handle: Any = None
    uid = ""
    try:
        web_port, port, ro_port = free_port(), free_port(), free_port()
        serve = (f"mkdir -p /tmp/www && echo hello from containerd > /tmp/www/index.html && "
                 f"exec httpd -f -p 127.0.0.1:{web_port} -h /tmp/www")
        uid = api.store.create("pods", "default", {"metadata": {"name": "web"}, "spec": {
            "nodeName": NODE, "hostNetwork": True, "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "c", "image": ctrd.image,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", serve]}]}})["metadata"]["uid"]
        node_kubeconfig = api.kubeconfig(tmp_path / "node.kubeconfig",
                                         user=f"system:node:{NODE}", groups=("system:nodes",))
        (tmp_path / "kube").mkdir()
        kubeconfig = api.kubeconfig(tmp_path / "kube" / "config", user="admin",
                                    token="admin-token")
        handle = agent(config={
            "nodeName": NODE, "kubeconfig": str(node_kubeconfig), "port": port,
            "readOnlyPort": ro_port, "runtimeEndpoint": ctrd.endpoint,
            "cgroupRoot": cgroup_root, "stopPodsOnExit": True,
            "authentication": {"x509": {"clientCAFile": str(api.kubelet_client_ca)},
                               "anonymous": {"enabled": False}},
            "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}})
        wait_for(lambda: _running(ro_port, "web") and _serving(web_port), timeout=120,
                 message="web serving on containerd")
        wait_for(lambda: api.store.get("nodes", "", NODE)["status"].get("daemonEndpoints"),
                 timeout=30, message="the node registered")
        cluster = Cluster(api, handle, kubeconfig, ro_port, web_port, tmp_path, port)
        done = cluster.kubectl("exec", "web", "--", "sh", "-c", "echo hi; exit 3", env=SPDY)
        assert (done.returncode, done.stdout) == (3, "hi\n"), done.stderr
        piped = cluster.kubectl("exec", "-i", "web", "--", "cat", input="in\n", env=SPDY)
        assert (piped.returncode, piped.stdout) == (0, "in\n"), piped.stderr
        local = free_port()
        proc = subprocess.Popen(
            ["kubectl", "--kubeconfig", str(kubeconfig), "port-forward", "pod/web",
             f"{local}:{web_port}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env={**os.environ, **SPDY, "HOME": str(kubeconfig.parent)})
        try:
            assert proc.stdout is not None
            assert "Forwarding from" in proc.stdout.readline()
            resp = requests.get(f"http://127.0.0.1:{local}/index.html", timeout=30)
            assert resp.status_code == 200 and resp.text == "hello from containerd\n"
        finally:
            proc.terminate()
            proc.communicate(timeout=30)
    finally:
        if handle is not None:
            handle.stop()  # stopPodsOnExit: the pod stops with it
        api.stop()
        cri = new_runtime_client(ctrd.endpoint, timeout=30.0)
        try:
            for sandbox in cri.list_pod_sandbox():
                if uid and sandbox.labels.get(L.POD_UID) == uid:
                    with contextlib.suppress(CriError):
                        cri.stop_pod_sandbox(sandbox.id)
                        cri.remove_pod_sandbox(sandbox.id)
        finally:
            cri.close()
        remove_pod_cgroup(cgroup_root)
