"""docs/JOINING.md's path from a fresh machine to a Ready node, run as printed (the project's
rule: every command the docs give as advice works and a test runs it). Each block marked
``<!-- run: NAME -->`` is taken from the page and run with bash (``set -euo pipefail``) against
the stand-in API server, with only the page's placeholders replaced by this test's values: the
API server's address, ``/etc/podvisor`` (a temporary folder), the node name and IP, the token
of step 1 and the CSR names ``kubectl get csr`` shows. The stand-in plays a cluster without
kubeadm (no bindings seeded), so the "without kubeadm" block has to make them; ``kubeadm token
create`` runs only where kubeadm is installed (it is not in Debian), against that cluster."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import AgentHandle
from tests.support.kubeapi import ApiError, KubeApi
from tests.support.kubeapi.bootstrap import admin_kubeconfig
from tests.support.lifecycle import free_port

DOC = Path(__file__).resolve().parents[2] / "docs" / "JOINING.md"
NODE = "worker-1"

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None,
                                reason="kubectl is not installed (Debian: kubernetes-client)")


def blocks() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    found = re.findall(r"<!-- run: ([\w-]+) -->\n```\w*\n(.*?)\n```", text, flags=re.S)
    return dict(found)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi", kubeadm=False)
    server.start()
    yield server
    server.stop()


class Shell:
    def __init__(self, cwd: Path, admin: Path, etc: Path, api: KubeApi) -> None:
        self.cwd, self.admin, self.etc, self.api = cwd, admin, etc, api

    def localize(self, script: str) -> str:
        return (script.replace("/etc/podvisor", str(self.etc))
                .replace("https://API-SERVER:6443", self.api.url))

    def run(self, script: str, **subst: str) -> subprocess.CompletedProcess[str]:
        script = self.localize(script)
        for old, new in subst.items():
            script = script.replace(old, new)
        done = subprocess.run(["bash", "-c", "set -euo pipefail\n" + script],
                              capture_output=True, text=True, timeout=120, cwd=self.cwd,
                              env={**os.environ, "HOME": str(self.cwd),
                                   "KUBECONFIG": str(self.admin)})
        assert done.returncode == 0, f"{script}\n--\n{done.stdout}\n{done.stderr}"
        return done


def csr_names(api: KubeApi, signer: str) -> list[str]:
    items, _ = api.store.list("certificatesigningrequests", None)
    return [i["metadata"]["name"] for i in items if i["spec"]["signerName"] == signer
            and not (i.get("status") or {}).get("conditions")]


def logged(handle: AgentHandle, event: str) -> list[dict[str, Any]]:
    path = handle.paths.logs_dir / "certificates.log"
    if not path.exists():
        return []
    return [d for line in path.read_text().splitlines() if line.startswith("{")
            and (d := json.loads(line)).get("event") == event]


@pytest.mark.timeout(300)
def test_the_joining_page_from_a_fresh_machine_to_a_ready_node(
        api: KubeApi, agent: Any, wait_for: Callable[..., Any], tmp_path: Path) -> None:
    doc = blocks()
    assert list(doc)[:4] == ["kubeadm-token", "token-without-kubeadm", "ca",
                             "bootstrap-kubeconfig"]  # the page starts with the token
    shell = Shell(tmp_path, admin_kubeconfig(api, tmp_path / "admin"), tmp_path / "etc", api)
    # 1. the token (kubeadm where installed, else what it makes) and the CA
    if shutil.which("kubeadm"):
        token = shell.run(doc["kubeadm-token"]).stdout.strip().splitlines()[-1]
    else:
        token = shell.run(doc["token-without-kubeadm"]).stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"[a-z0-9]{6}\.[a-z0-9]{16}", token), token
    shell.run(doc["ca"])
    assert (tmp_path / "ca.crt").read_bytes() == api.ca_file.read_bytes()
    # 2. on the new machine (the CA copied to /etc/podvisor)
    (tmp_path / "etc").mkdir()
    shutil.copy(tmp_path / "ca.crt", tmp_path / "etc" / "ca.crt")
    shell.run(doc["bootstrap-kubeconfig"], **{"abcdef.0123456789abcdef": token})
    boot = yaml.safe_load((tmp_path / "etc" / "bootstrap-kubeconfig").read_text())
    assert boot["users"][0]["user"]["token"] == token
    # 3. the config as printed (this machine's address, a free port), and start
    config = yaml.safe_load(shell.localize(doc["config"]))
    assert config["nodeName"] == NODE
    config.update(nodeIP="127.0.0.1", address="127.0.0.1", port=free_port(), readOnlyPort=0,
                  stopPodsOnExit=True,
                  nodeLeaseRenewInterval="1s", nodeStatusUpdateFrequency="1s",
                  supervision={"heartbeatInterval": "200ms", "shutdownTimeout": "30s"})
    assert doc["start"].startswith("podvisor run --config ")
    handle = agent(config=config)  # `podvisor run --config FILE`, as the fixture runs it
    # 4. approve the client CSR, then the serving one, with the page's commands
    wait_for(lambda: csr_names(api, "kubernetes.io/kube-apiserver-client-kubelet"),
             timeout=30, message="the client CSR")
    name = csr_names(api, "kubernetes.io/kube-apiserver-client-kubelet")[0]
    pending = wait_for(lambda: logged(handle, "certificates.csr_pending"), timeout=30,
                       message="the log naming the CSR it waits for")  # written after the POST
    assert pending[0]["csr"] == name
    shown = shell.run(doc["approve"].splitlines()[0]).stdout
    assert name in shown
    shell.run(doc["approve"], **{"node-csr-...": name})
    wait_for(lambda: _ready(api), timeout=60, message="the Node registered, Ready")
    wait_for(lambda: csr_names(api, "kubernetes.io/kubelet-serving"), timeout=60,
             message="the serving CSR")
    serving = csr_names(api, "kubernetes.io/kubelet-serving")[0]
    assert serving.startswith("csr-")
    shell.run(doc["approve"], **{"node-csr-...": serving})
    wait_for(lambda: (handle.paths.root / "pki" / "kubelet-server-current.pem").exists(),
             timeout=30, message="the serving pair")
    kubeconfig = (tmp_path / "etc" / "kubeconfig").read_text()
    assert "kubelet-client-current.pem" in kubeconfig
    # 5. the checks print what the page says they print
    out = shell.run(doc["check"]).stdout.splitlines()
    assert re.fullmatch(r"v1\.33\.0\+podvisor-[0-9.]+", out[0]), out
    allocatable = json.loads(out[1])
    cpus = int(api.store.get("nodes", "", NODE)["status"]["capacity"]["cpu"])
    assert allocatable["cpu"] == f"{cpus * 1000 - 100}m"
    assert json.loads(out[2]) == [{"effect": "NoSchedule", "key": "dedicated",
                                   "value": "edge"}]
    labels = api.store.get("nodes", "", NODE)["metadata"]["labels"]
    assert labels["node.kubernetes.io/pool"] == "edge"
    # 7. RBAC without the Node authorizer; 9. a running node runs a pod (the embedded
    # runtime's host image for busybox: nothing can be pulled here)
    shell.run(doc["rbac"])
    binding = api.store.get("clusterrolebindings", "", f"podvisor-node-{NODE}")
    assert binding["subjects"][0]["name"] == f"system:node:{NODE}"
    shell.run(doc["metrics-reader"])  # 10. who may read the node's metrics
    assert api.store.get("clusterroles", "", "node-metrics-reader")["rules"][0]["verbs"] == \
        ["get"]
    shell.run(doc["check-running"], **{"image: busybox": "image: host"})
    wait_for(lambda: _pod_running(api, "hello"), timeout=60, message="pod hello Running")


def _pod_running(api: KubeApi, name: str) -> bool:
    try:
        pod = api.store.get("pods", "default", name)
    except ApiError:
        return False
    return pod.get("status", {}).get("phase") == "Running"


def _ready(api: KubeApi) -> bool:
    try:
        node = api.store.get("nodes", "", NODE)
    except ApiError:
        return False
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in node.get("status", {}).get("conditions", []))
