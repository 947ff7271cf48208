"""A node joins with a bootstrap kubeconfig only and stays joined (issue 26), the real agent
against the stand-in API server:

- the bootstrap token (the Secret ``kubeadm token create`` makes) is the node's only
  credential: the client CSR ``node-csr-<digest>`` is approved by running the very command the
  agent logs as advice (``kubectl certificate approve ...``), the node then registers as
  ``system:node:<name>`` and the token was used for nothing but the CSR API;
- the serving certificate (``serverTLSBootstrap``) comes the same way and the main port serves
  it, with the node's addresses;
- with a 45 s lifetime both are rotated at 70-90 % of it, twice, while a pod runs: no request
  is refused, the pod watch opened before the first rotation is never re-opened nor relisted,
  a pod created after the rotations runs, the pod running before is untouched, and requests
  after a rotation carry the new certificate;
- kill -9 of ``certificates`` at each step of the pair swap and after a CSR's creation, and of
  ``source-api`` and ``node`` while a rotation waits for approval: the node stays Ready, no
  request is refused, and no CSR is orphaned by a crash;
- the Node shows nodeIP, labels, taints, providerID and reserved resources as the kubelet's do,
  and kubeletVersion follows the skew policy (an API server older than podvisor allows is
  refused, then accepted once it is upgraded).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from podvisor.services.certificates.store import load_pair
from tests.conftest import AgentHandle
from tests.support.kubeapi import ApiError, KubeApi
from tests.support.kubeapi.bootstrap import (
    Approver,
    admin_kubeconfig,
    bootstrap_kubeconfig,
    create_token,
)
from tests.support.kubeapi.csr import CLIENT_KUBELET, SERVING
from tests.support.lifecycle import free_port

NODE = "boot-e2e"
CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
LIFETIME = 45.0
KUBECTL = shutil.which("kubectl")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi")
    server.start()
    yield server
    server.stop()


def log_events(handle: AgentHandle, process: str, event: str) -> list[dict[str, Any]]:
    path = handle.paths.logs_dir / f"{process}.log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("event") == event:
            out.append(doc)
    return out


def node_obj(api: KubeApi) -> dict[str, Any] | None:
    try:
        return api.store.get("nodes", "", NODE)
    except ApiError:
        return None


def ready(api: KubeApi) -> dict[str, Any] | None:
    node = node_obj(api)
    conds = {c["type"]: c for c in (node or {}).get("status", {}).get("conditions", [])}
    return node if conds.get("Ready", {}).get("status") == "True" else None


def csrs(api: KubeApi, signer: str) -> list[dict[str, Any]]:
    items, _ = api.store.list("certificatesigningrequests", None)
    return [i for i in items if i["spec"]["signerName"] == signer]


def signed(api: KubeApi, signer: str) -> int:
    return sum(1 for c in csrs(api, signer) if (c.get("status") or {}).get("certificate"))


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": NODE, "restartPolicy": "Always",
                     "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False,
                     "containers": [{"name": "c", "image": "host",
                                     "command": ["sleep", "3600"]}]}}


def running(api: KubeApi, name: str) -> dict[str, Any] | None:
    try:
        obj = api.store.get("pods", "default", name)
    except ApiError:
        return None
    statuses = obj.get("status", {}).get("containerStatuses") or []
    return obj if statuses and "running" in statuses[0].get("state", {}) else None


def serving_cert(port: int, ca: Path) -> dict[str, Any]:
    """The main port's certificate, verified against the cluster CA (no client auth asked)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.check_hostname = False
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        cert = tls.getpeercert()
    assert cert is not None
    return cert


def config(tmp: Path, api: KubeApi, token: str, **extra: Any) -> dict[str, Any]:
    return {"nodeName": NODE, "kubeconfig": str(tmp / "kubeconfig"),
            "bootstrapKubeconfig": str(bootstrap_kubeconfig(api, tmp / "bootstrap-kubeconfig",
                                                            token)),
            "rotateCertificates": True, "serverTLSBootstrap": True,
            "nodeIP": "127.0.0.1", "port": free_port(), "readOnlyPort": 0,
            "nodeLeaseRenewInterval": "1s", "nodeStatusUpdateFrequency": "1s",
            "apiWatchTimeout": "5m", "stopPodsOnExit": True,
            "authentication": {"anonymous": {"enabled": True}},
            "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"},
            **extra}


def run_advice(advice: str, admin: Path) -> subprocess.CompletedProcess[str]:
    """The logged advice exactly as printed, as the cluster's admin."""
    words = shlex.split(advice)
    assert words[0] == "kubectl"
    return subprocess.run([KUBECTL or "kubectl", "--kubeconfig", str(admin), *words[1:]],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(admin.parent)})


@pytest.mark.timeout(420)
@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (Debian: kubernetes-client)")
def test_join_with_a_bootstrap_token_only_then_rotate_without_a_gap(
        api: KubeApi, agent: Any, wait_for: Callable[..., Any], tmp_path: Path) -> None:
    api.csr.signing_duration, api.csr.backdate = LIFETIME, 0.0
    api.version = {"major": "1", "minor": "31", "gitVersion": "v1.31.4"}
    token = create_token(api)
    admin = admin_kubeconfig(api, tmp_path / "admin")
    cfg = config(tmp_path, api, token, nodeLabels={"disk": "ssd"},
                 registerWithTaints=[{"key": "dedicated", "value": "ci",
                                      "effect": "NoSchedule"}],
                 providerID="podvisor://lab/boot-e2e", kubeReserved={"cpu": "100m"},
                 systemReserved={"memory": "64Mi"})
    handle = agent(config=cfg)
    # 1. the bootstrap CSR, approved with the advice the agent logs
    pending = wait_for(lambda: log_events(handle, "certificates", "certificates.csr_pending"),
                       timeout=30, message="the bootstrap CSR")
    advice = pending[0]["advice"]
    name = advice.split()[-1]
    assert advice == f"kubectl certificate approve {name}" and name.startswith("node-csr-")
    obj = api.store.get("certificatesigningrequests", "", name)
    assert obj["spec"]["username"] == f"system:bootstrap:{token[:6]}"
    assert obj["spec"]["signerName"] == CLIENT_KUBELET
    assert sorted(obj["spec"]["usages"]) == ["client auth", "digital signature",
                                             "key encipherment"]
    assert node_obj(api) is None  # nothing else can talk to the API yet
    done = run_advice(advice, admin)
    assert done.returncode == 0, done.stderr
    assert f"certificatesigningrequest.certificates.k8s.io/{name} approved" in done.stdout
    # 2. the node registers with its own certificate; the token served the CSR API only
    approver = Approver(admin).start()  # from here on, the test approves every request
    try:
        node = wait_for(lambda: ready(api), timeout=60, message="Node Ready")
        creators = {r.user for r in api.requests if r.method == "POST"
                    and r.path == "/api/v1/nodes"}
        assert creators == {f"system:node:{NODE}"}
        token_paths = {r.path for r in api.requests if r.user.startswith("system:bootstrap:")}
        assert token_paths and all(p.startswith(CSRS) or p in ("/version", "/healthz")
                                   for p in token_paths), token_paths
        kubeconfig = Path(cfg["kubeconfig"])
        current = handle.paths.root / "pki" / "kubelet-client-current.pem"
        assert f"client-certificate: {current}" in kubeconfig.read_text()
        assert current.is_symlink() and (os.stat(current).st_mode & 0o777) == 0o600
        # the Node as the kubelet's (nodeIP, labels, taints, providerID, allocatable, version)
        meta, spec, status = node["metadata"], node.get("spec", {}), node["status"]
        assert meta["labels"]["disk"] == "ssd"
        assert spec["taints"] == [{"key": "dedicated", "value": "ci", "effect": "NoSchedule"}]
        assert spec["providerID"] == "podvisor://lab/boot-e2e"
        assert {"type": "InternalIP", "address": "127.0.0.1"} in status["addresses"]
        cpus = int(status["capacity"]["cpu"])
        assert status["allocatable"]["cpu"] == f"{cpus * 1000 - 100}m"
        assert status["allocatable"]["memory"] != status["capacity"]["memory"]
        assert status["nodeInfo"]["kubeletVersion"] == "v1.31.0+podvisor-0.1.0"
        # 3. the serving certificate: approved by the approver, served by the main port
        wait_for(lambda: signed(api, SERVING) >= 1, timeout=60, message="serving cert signed")
        served = wait_for(lambda: _served(cfg["port"], api.ca_file), timeout=30,
                          message="the main port serves the signed certificate")
        assert ("IP Address", "127.0.0.1") in served["subjectAltName"]
        assert dict(x[0] for x in served["subject"])["commonName"] == f"system:node:{NODE}"
        # 4. a pod runs; then the pairs are rotated twice with no gap
        api.create_pod("default", pod("before"))
        before = wait_for(lambda: running(api, "before"), timeout=60, message="pod running")
        cid = before["status"]["containerStatuses"][0]["containerID"]
        node_user = f"system:node:{NODE}"

        def pod_watches() -> int:
            return sum(1 for r in list(api.requests) if r.path == "/api/v1/pods"
                       and "watch=1" in r.query and r.user == node_user)

        def pod_lists() -> int:
            return sum(1 for r in list(api.requests) if r.path == "/api/v1/pods"
                       and "watch" not in r.query and r.user == node_user)

        # the watch in flight is recorded when it ends: count the started ones by their end
        first_serial = load_pair(current).serial
        watches, lists = pod_watches(), pod_lists()
        wait_for(lambda: signed(api, CLIENT_KUBELET) >= 3, timeout=4 * LIFETIME,
                 message="two client rotations")
        wait_for(lambda: signed(api, SERVING) >= 2, timeout=2 * LIFETIME,
                 message="a serving rotation")
        api.create_pod("default", pod("after"))
        wait_for(lambda: running(api, "after"), timeout=60, message="a new pod runs")
        assert pod_watches() == watches and pod_lists() == lists  # no re-watch, no relist
        assert api.count(code=401) == 0, [r for r in api.requests if r.code == 401][:3]
        now_serial = load_pair(current).serial
        assert now_serial != first_serial
        wait_for(lambda: any(r.serial and int(r.serial, 16) not in (0, first_serial)
                             for r in list(api.requests)[-50:]
                             if r.path.endswith(f"/leases/{NODE}")), timeout=30,
                 message="the Lease renewed with a rotated certificate")
        still = running(api, "before")
        assert still is not None
        assert still["status"]["containerStatuses"][0]["containerID"] == cid
        assert still["status"]["containerStatuses"][0]["restartCount"] == 0
        assert _served(cfg["port"], api.ca_file)["serialNumber"] != served["serialNumber"]
        assert handle.state("certificates")["restarts"] == 0
        deadlines = log_events(handle, "certificates", "certificates.deadline")
        for d in deadlines:
            assert d["rotation_deadline"] >= d["not_after"] - 0.3 * LIFETIME - 1
            assert d["rotation_deadline"] <= d["not_after"] - 0.1 * LIFETIME + 1
    finally:
        approver.stop()


def _served(port: int, ca: Path) -> dict[str, Any] | None:
    try:
        return serving_cert(port, ca)
    except (OSError, ssl.SSLError):
        return None


POINTS = ("csr.after_create", "pair.before_symlink", "pair.before_swap", "pair.after_swap")


@pytest.mark.timeout(420)
def test_kill_9_mid_rotation_loses_nothing(api: KubeApi, agent: Any,
                                           wait_for: Callable[..., Any], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    api.csr.signing_duration, api.csr.backdate = LIFETIME, 0.0
    once = tmp_path / "once"
    once.mkdir()
    fired = [once / f"certificates.{p}" for p in POINTS]
    for path in fired:  # passed already: armed only once the node has joined
        path.touch()
    monkeypatch.setenv("PODVISOR_CRASH_AT", ",".join(f"certificates:{p}" for p in POINTS))
    monkeypatch.setenv("PODVISOR_CRASH_ONCE_DIR", str(once))
    token = create_token(api)
    admin = admin_kubeconfig(api, tmp_path / "admin")
    held: list[str] = []  # while set, the approver holds rotation CSRs back

    approver = Approver(admin, lambda spec: not held).start()
    handle = agent(config=config(tmp_path, api, token, serverTLSBootstrap=False,
                                 supervision={"heartbeatInterval": "200ms",
                                              "shutdownTimeout": "30s",
                                              "processes": {"certificates": {
                                                  "backoffCap": "1s"}}}))
    try:
        wait_for(lambda: ready(api), timeout=60, message="Node Ready")
        for path in fired:  # armed: the next rotation is killed at each step, once
            path.unlink()
        wait_for(lambda: all(p.exists() for p in fired), timeout=4 * LIFETIME,
                 message="kill -9 at every step of a rotation")
        wait_for(lambda: handle.state("certificates")["state"] == "RUNNING", timeout=30)
        # kill -9 of source-api and node while a rotation waits for its approval
        held.append("hold")
        count = len(csrs(api, CLIENT_KUBELET))
        wait_for(lambda: len(csrs(api, CLIENT_KUBELET)) > count, timeout=2 * LIFETIME,
                 message="a rotation CSR waiting")
        for name in ("source-api", "node"):
            pid = handle.wait_state(name, "RUNNING")["pid"]
            os.kill(pid, signal.SIGKILL)
            handle.wait_state(name, "RUNNING", where=lambda r, p=pid: r["pid"] != p)
        held.clear()
        wait_for(lambda: all((c.get("status") or {}).get("certificate")
                             for c in csrs(api, CLIENT_KUBELET)), timeout=60,
                 message="every client CSR issued (none orphaned by a crash)")
        wait_for(lambda: ready(api), timeout=30, message="still Ready")
        assert api.count(code=401) == 0, [r for r in api.requests if r.code == 401][:3]
        pair = load_pair(handle.paths.root / "pki" / "kubelet-client-current.pem")
        assert pair.valid_at(api.wall())
        assert handle.state("certificates")["restarts"] == len(POINTS)
    finally:
        approver.stop()


@pytest.mark.timeout(300)
def test_kubelet_version_follows_the_skew_policy(api: KubeApi, agent: Any,
                                                 wait_for: Callable[..., Any],
                                                 tmp_path: Path) -> None:
    api.version = {"major": "1", "minor": "27", "gitVersion": "v1.27.16"}
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", user=f"system:node:{NODE}",
                                groups=("system:nodes",))
    handle = agent(config={"nodeName": NODE, "kubeconfig": str(kubeconfig),
                           "nodeLeaseRenewInterval": "1s", "nodeStatusUpdateFrequency": "1s",
                           "supervision": {"heartbeatInterval": "200ms"}})
    refused = wait_for(lambda: log_events(handle, "node", "node.version_refused"), timeout=30,
                       message="the old API server refused")
    assert "version-skew policy" in refused[0]["reason"]
    assert node_obj(api) is None
    api.version = {"major": "1", "minor": "38", "gitVersion": "v1.38.0"}  # upgraded
    node = wait_for(lambda: ready(api), timeout=30, message="registered after the upgrade")
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.33.0+podvisor-0.1.0"
    skew = wait_for(lambda: log_events(handle, "node", "node.version_skew"), timeout=10)
    assert "more than 3 minors older" in skew[0]["reason"]
