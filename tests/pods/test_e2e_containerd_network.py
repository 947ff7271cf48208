"""End to end on containerd: pod networks (CNI, configured by deploy/containerd/setup.sh).

- A pod without hostNetwork runs in its own network namespace: `/pods` (and `podvisorctl pods
  --wide`) show its own IP, the host reaches busybox httpd on that IP, its httpGet readiness
  probe (no host: the pod IP) passes; a pod with a hostPort is reachable on the host's
  127.0.0.1:hostPort (CNI portmap; loopback DNAT works because portmap's `snat` sets
  `route_localnet` on the bridge and masquerades 127.0.0.1). Deleting the manifests removes the
  sandboxes and, with them, portmap's iptables rules.
- On a containerd that reports NetworkReady=false (no CNI config, e.g. an instance set up by the
  scripts before CNI): a hostNetwork pod runs, a pod without it is held with no sandbox created,
  and the agent says so once: a NetworkNotReady event on the node and on the pod, and a
  `/healthz` detail line.

Each group skips with the reason when the session's containerd is not the kind it needs
(tests/runtime/containerd.py `containerd_or_skip()`; unset PODVISOR_CONTAINERD_ENDPOINT as root
starts a private instance from deploy/containerd, which has CNI). Every sandbox made here is
removed; pods go under a per-test `cgroupRoot`, removed at the end.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from podvisor.services.cri import CriError, new_runtime_client
from podvisor.services.cri.client import RuntimeClient
from podvisor.services.syncloop import labels as L
from tests.pods.lifecycle import agent_config, all_running, free_port, get_pods
from tests.runtime.containerd import ContainerdHandle, containerd_or_skip, remove_pod_cgroup

pytestmark = pytest.mark.containerd
IMAGE = "localhost/podvisor/busybox:1"
HTTPD = "mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www"


def network_ready(endpoint: str) -> tuple[bool, str]:
    cri = new_runtime_client(endpoint, timeout=10.0)
    try:
        for cond in cri.status().status.conditions:
            if cond.type == "NetworkReady":
                return bool(cond.status), f"{cond.reason}: {cond.message}"
        return False, "no NetworkReady condition"
    finally:
        cri.close()


@pytest.fixture(scope="module")
def containerd() -> ContainerdHandle:
    """Module scope: the session's containerd starts before the per-test leak snapshot."""
    return containerd_or_skip()


@pytest.fixture
def with_cni(containerd: ContainerdHandle) -> ContainerdHandle:
    ready, why = network_ready(containerd.endpoint)
    if not ready:
        pytest.skip(f"the containerd at {containerd.endpoint} has no pod network (NetworkReady="
                    f"false, {why}); set it up with this tree's deploy/containerd/setup.sh")
    return containerd


@pytest.fixture
def without_cni(containerd: ContainerdHandle) -> ContainerdHandle:
    ready, _why = network_ready(containerd.endpoint)
    if ready:
        pytest.skip(f"the containerd at {containerd.endpoint} reports NetworkReady=true (it has "
                    "a CNI config); the not-ready case needs one without")
    return containerd


@pytest.fixture
def manifests() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="pvnet", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def pod(name: str, *, host_network: bool = False, host_port: int = 0,
        probe: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "web", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", HTTPD if not host_network else "exec sleep 3600"],
        "ports": [{"containerPort": 8080, **({"hostPort": host_port} if host_port else {})}]}
    if host_network:
        container.pop("ports")
    if probe:
        container["readinessProbe"] = {"httpGet": {"port": 8080, "path": "/"},
                                       "periodSeconds": 1}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"hostNetwork": host_network, "terminationGracePeriodSeconds": 1,
                     "containers": [container]}}


def write(manifests: Path, *pods: dict[str, Any]) -> None:
    for p in pods:
        (manifests / f"{p['metadata']['name']}.yaml").write_text(yaml.safe_dump(p), "utf-8")


def ours(cri: RuntimeClient, uids: set[str]) -> list[Any]:
    return [s for s in cri.list_pod_sandbox() if s.labels.get(L.POD_UID) in uids]


def clean(cri: RuntimeClient, cgroup_root: str, uids: set[str]) -> None:
    for sandbox in ours(cri, uids):
        try:
            cri.stop_pod_sandbox(sandbox.id)
            cri.remove_pod_sandbox(sandbox.id)
        except CriError:
            pass
    remove_pod_cgroup(cgroup_root)


def http_get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return str(resp.read().decode().strip())
    except (urllib.error.URLError, OSError):
        return None


def instance_subnet(handle: ContainerdHandle) -> ipaddress.IPv4Network | None:
    env = Path(handle.socket_path).parent.parent / "instance.env"
    for line in env.read_text().splitlines() if env.is_file() else []:
        if line.startswith("SUBNET="):
            return ipaddress.IPv4Network(line.removeprefix("SUBNET="))
    return None


def nat_rules() -> str:
    return subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True,
                          check=False).stdout


@pytest.mark.timeout(170)
def test_pods_get_their_own_ip_and_host_ports(agent: Any, with_cni: ContainerdHandle,
                                              manifests: Path, wait_for: Any) -> None:
    host_port = free_port()
    write(manifests, pod("own", probe=True), pod("mapped", host_port=host_port))
    port = free_port()
    cri = new_runtime_client(with_cni.endpoint, timeout=30.0)
    uids: set[str] = set()
    cgroup_root = f"/podvisor-test-{secrets.token_hex(4)}"
    try:
        handle = agent(config=agent_config(manifests, port, runtimeEndpoint=with_cni.endpoint,
                                           cgroupRoot=cgroup_root))
        body = wait_for(lambda: (b := get_pods(port)) and all_running(b, {"own", "mapped"})
                        and all(p["status"].get("podIP") for p in b["items"]) and b,
                        120.0, 0.2, "both pods Running with an IP in /pods")
        uids = {p["metadata"]["uid"] for p in body["items"]}
        by_name = {p["metadata"]["name"].removesuffix("-e2e"): p["status"]
                   for p in body["items"]}
        ips = {name: st["podIP"] for name, st in by_name.items()}
        assert ips["own"] != ips["mapped"], ips
        for name, st in by_name.items():
            assert st["podIPs"] == [{"ip": ips[name]}] and st["hostIP"] == "127.0.0.1"
            assert st["hostIPs"] == [{"ip": "127.0.0.1"}]
            ip = ipaddress.IPv4Address(ips[name])
            subnet = instance_subnet(with_cni)
            assert ip in subnet if subnet is not None else not ip.is_loopback, (ip, subnet)
        # the host reaches the pod on its own IP; the pod's hostname is its own (own netns)
        assert wait_for(lambda: http_get(f"http://{ips['own']}:8080/"), 30.0, 0.2,
                        "httpd on the pod IP") == "own-e2e"
        # the readiness probe (httpGet without host: the pod IP) passes
        wait_for(lambda: (b := get_pods(port)) and any(
            p["metadata"]["name"] == "own-e2e" and p["status"]["containerStatuses"][0]["ready"]
            for p in b["items"]), 30.0, 0.2, "the pod Ready through its IP")
        # hostPort: the host's loopback, through portmap's DNAT
        assert wait_for(lambda: http_get(f"http://127.0.0.1:{host_port}/"), 30.0, 0.2,
                        f"the hostPort on 127.0.0.1:{host_port}") == "mapped-e2e"
        assert f"--dport {host_port}" in nat_rules()
        wide = handle.ctl("pods", "--wide")
        assert wide.returncode == 0, wide.stderr
        rows = {line.split()[0]: line.split() for line in wide.stdout.splitlines()}
        assert rows["NAME"][-1] == "IP" and rows["own-e2e"][-1] == ips["own"]
        # deleting the manifests removes the sandboxes, and CNI DEL their iptables rules
        for f in manifests.iterdir():
            f.unlink()
        wait_for(lambda: not ours(cri, uids), 60.0, 0.2, "every sandbox removed")
        assert f"--dport {host_port}" not in nat_rules()
        assert handle.stop() == 0
    finally:
        clean(cri, cgroup_root, uids)
        cri.close()


@pytest.mark.timeout(120)
def test_network_not_ready_is_said_once_and_holds_only_pod_network_pods(
        agent: Any, without_cni: ContainerdHandle, manifests: Path, wait_for: Any) -> None:
    write(manifests, pod("own"), pod("host", host_network=True))
    port = free_port()
    cri = new_runtime_client(without_cni.endpoint, timeout=30.0)
    uids: set[str] = set()
    cgroup_root = f"/podvisor-test-{secrets.token_hex(4)}"
    try:
        handle = agent(config=agent_config(manifests, port, runtimeEndpoint=without_cni.endpoint,
                                           cgroupRoot=cgroup_root, stopPodsOnExit=True))
        body = wait_for(lambda: (b := get_pods(port)) and len(b["items"]) == 2 and all_running(
            {"items": [p for p in b["items"] if p["metadata"]["name"] == "host-e2e"]}, {"host"})
            and b, 60.0, 0.2, "the hostNetwork pod Running")
        uids = {p["metadata"]["uid"] for p in body["items"]}
        own = next(p for p in body["items"] if p["metadata"]["name"] == "own-e2e")
        assert own["status"]["phase"] == "Pending" and own["status"]["podIP"] == ""
        wait_for(lambda: http_get_status(port, "/healthz")[1].count("[!]runtime-network") == 1,
                 30.0, 0.2, "the /healthz detail")
        code, text = http_get_status(port, "/healthz")
        assert code == 200 and "NetworkReady=false" in text
        events = wait_for(lambda: (e := network_events(handle)) and len(e) >= 2 and e, 30.0, 0.2,
                          "the NetworkNotReady events")
        kinds = sorted(e["involvedObject"]["kind"] for e in events)
        assert kinds == ["Node", "Pod"], events  # once each, not once per retry
        assert all(e["count"] == 1 for e in events), events
        own_uid = own["metadata"]["uid"]
        assert not ours(cri, {own_uid})  # held: no sandbox was even tried
        assert handle.stop() == 0
        wait_for(lambda: not ours(cri, uids), 60.0, 0.2, "every sandbox removed")
    finally:
        clean(cri, cgroup_root, uids)
        cri.close()


def http_get_status(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except (urllib.error.URLError, OSError):
        return 0, ""


def network_events(handle: Any) -> list[dict[str, Any]]:
    done = handle.ctl("events", "--json")
    if done.returncode != 0:
        return []
    items: list[dict[str, Any]] = json.loads(done.stdout)["items"]
    return [e for e in items if e.get("reason") == "NetworkNotReady"]
