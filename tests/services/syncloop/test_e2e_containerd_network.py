"""End to end on containerd: pod networks (CNI, configured by deploy/containerd/setup.sh).

- A pod without hostNetwork runs in its own network namespace: `/pods` (and `podvisorctl pods
  --wide`) show its own IP, the host reaches busybox httpd on that IP, its httpGet readiness
  probe (no host: the pod IP) passes; a pod with a hostPort is reachable on the host's
  127.0.0.1:hostPort (CNI portmap; loopback DNAT works because portmap's `snat` sets
  `route_localnet` on the bridge and masquerades 127.0.0.1). Deleting the manifests removes the
  sandboxes and, with them, portmap's iptables rules.
- On a private containerd of this module without CNI (`PODVISOR_CONTAINERD_CNI=off`, needs
  root): NetworkReady=false is said once, only hostNetwork pods run, a pod with sandboxes whose
  network setup failed recovers once the network is configured (see the test's docstring).

The first test uses the session's containerd (tests/support/containerd.py
`containerd_or_skip()`; unset PODVISOR_CONTAINERD_ENDPOINT as root starts a private instance
from deploy/containerd, which has CNI) and skips with the reason when it has no pod network.
Every sandbox made here is removed; pods go under a per-test `cgroupRoot`, removed at the end.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from podvisor.services.cri import CriError, new_runtime_client
from podvisor.services.cri.client import RuntimeClient
from podvisor.services.pod import pod_from_dict
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.cri_config import sandbox_config
from tests.support.containerd import (
    DEPLOY_DIR,
    ContainerdHandle,
    containerd_or_skip,
    register_session_process,
    remove_pod_cgroup,
)
from tests.support.lifecycle import agent_config, all_running, free_port, get_pods

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


@dataclass(frozen=True)
class PrivateInstance:
    directory: Path
    handle: ContainerdHandle


@pytest.fixture(scope="module")
def without_cni() -> Iterator[PrivateInstance]:
    """A private containerd of this module WITHOUT a CNI config (`PODVISOR_CONTAINERD_CNI=off`:
    NetworkReady=false), started before the per-test leak snapshot and purged at the end;
    a test may turn its network on with `start.sh` (CNI on) while it runs."""
    if os.geteuid() != 0:
        pytest.skip(f"a private containerd needs root (euid {os.geteuid()})")
    if shutil.which("containerd") is None:
        pytest.skip("containerd not installed (run deploy/containerd/setup.sh as root)")
    directory = Path(tempfile.mkdtemp(prefix="pvnocni-", dir="/tmp"))
    env = {**os.environ, "PODVISOR_CONTAINERD_CNI": "off"}
    done = subprocess.run(["bash", str(DEPLOY_DIR / "start.sh"), str(directory)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    pid_file = directory / "containerd.pid"
    pid = int(pid_file.read_text()) if pid_file.exists() else 0
    if pid:
        register_session_process(pid)
    try:
        if done.returncode != 0:
            pytest.skip(f"a private containerd did not start: {done.stderr.strip()[-300:]}")
        endpoint = f"unix://{directory}/run/containerd.sock"
        yield PrivateInstance(directory, ContainerdHandle(
            endpoint, IMAGE, "localhost/podvisor/pause:1", "/podvisor-containerd", directory))
    finally:
        subprocess.run(["bash", str(DEPLOY_DIR / "stop.sh"), "--purge", str(directory)],
                       capture_output=True, text=True, timeout=120, check=False)
        if pid:  # pytest is a subreaper: containerd was re-parented to it
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def pod(name: str, *, host_network: bool = False, host_port: int = 0,
        probe: bool = False, host_ip: str = "") -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "web", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", HTTPD if not host_network else "exec sleep 3600"],
        "ports": [{"containerPort": 8080, **({"hostPort": host_port} if host_port else {}),
                   **({"hostIP": host_ip} if host_ip else {})}]}
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
    host_port, bound_port = free_port(), free_port()
    write(manifests, pod("own", probe=True), pod("mapped", host_port=host_port),
          pod("bound", host_port=bound_port, host_ip="127.0.0.1"))
    port = free_port()
    cri = new_runtime_client(with_cni.endpoint, timeout=30.0)
    uids: set[str] = set()
    cgroup_root = f"/podvisor-test-{secrets.token_hex(4)}"
    try:
        handle = agent(config=agent_config(manifests, port, runtimeEndpoint=with_cni.endpoint,
                                           cgroupRoot=cgroup_root))
        body = wait_for(lambda: (b := get_pods(port))
                        and all_running(b, {"own", "mapped", "bound"})
                        and all(p["status"].get("podIP") for p in b["items"]) and b,
                        120.0, 0.2, "both pods Running with an IP in /pods")
        uids = {p["metadata"]["uid"] for p in body["items"]}
        by_name = {p["metadata"]["name"].removesuffix("-e2e"): p["status"]
                   for p in body["items"]}
        ips = {name: st["podIP"] for name, st in by_name.items()}
        assert len(set(ips.values())) == 3, ips
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
        # hostIP: the host port on that address only (portmap's DNAT matches -d hostIP)
        assert wait_for(lambda: http_get(f"http://127.0.0.1:{bound_port}/"), 30.0, 0.2,
                        f"the hostPort on 127.0.0.1:{bound_port}") == "bound-e2e"
        bound_rules = [r for r in nat_rules().splitlines() if f"--dport {bound_port}" in r
                       and "-j DNAT" in r]
        assert bound_rules and all("-d 127.0.0.1/32" in r for r in bound_rules), bound_rules
        assert not [r for r in nat_rules().splitlines() if f"--dport {host_port}" in r
                    and "-j DNAT" in r and "-d 127.0.0.1/32" in r]
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


@pytest.mark.timeout(200)
def test_network_not_ready_then_ready_on_a_containerd_without_cni(
        agent: Any, without_cni: PrivateInstance, manifests: Path, wait_for: Any) -> None:
    """containerd without CNI: the hostNetwork pod runs, the other is held (no sandbox made) and
    NetworkNotReady is said once (node and pod events, `/healthz`). The pod already has three
    sandboxes whose network setup failed (what an earlier agent left: NOTREADY, no creation
    time, names reserved, unstoppable). Once the network is configured (containerd reads the
    conflist live), the held pod starts at once in a sandbox of attempt 3 (never a reserved
    name) and the dead sandboxes are stopped and removed."""
    endpoint = without_cni.handle.endpoint
    ready, why = network_ready(endpoint)
    assert not ready, why
    uid = secrets.token_hex(16)
    own = pod("own")
    own["metadata"]["uid"] = uid
    write(manifests, own, pod("host", host_network=True))
    port = free_port()
    cri = new_runtime_client(endpoint, timeout=30.0)
    uids: set[str] = {uid}
    cgroup_root = f"/podvisor-test-{secrets.token_hex(4)}"
    logs = Path(tempfile.mkdtemp(prefix="pvnocni-logs-", dir="/tmp"))
    try:
        parsed = pod_from_dict({**own, "metadata": {**own["metadata"], "name": "own-e2e"}}).pod
        for attempt in range(3):  # an earlier agent's failed tries
            config = sandbox_config(parsed, attempt, logs, f"{cgroup_root}/pod{uid}")
            with pytest.raises(CriError, match="cni plugin not initialized"):
                cri.run_pod_sandbox(config)
        dead = {s.id for s in ours(cri, {uid})}
        assert len(dead) == 3
        handle = agent(config=agent_config(manifests, port, runtimeEndpoint=endpoint,
                                           cgroupRoot=cgroup_root, stopPodsOnExit=True))
        body = wait_for(lambda: (b := get_pods(port)) and len(b["items"]) == 2 and all_running(
            {"items": [p for p in b["items"] if p["metadata"]["name"] == "host-e2e"]}, {"host"})
            and b, 60.0, 0.2, "the hostNetwork pod Running")
        uids |= {p["metadata"]["uid"] for p in body["items"]}
        held = next(p for p in body["items"] if p["metadata"]["uid"] == uid)
        assert held["status"]["phase"] == "Pending" and held["status"]["podIP"] == ""
        wait_for(lambda: http_get_status(port, "/healthz")[1].count("[!]runtime-network") == 1,
                 30.0, 0.2, "the /healthz detail")
        code, text = http_get_status(port, "/healthz")
        assert code == 200 and "NetworkReady=false" in text and "cni plugin not initialized" \
            in text
        events = wait_for(lambda: (e := network_events(handle, "NetworkNotReady")) and
                          len(e) >= 2 and e, 30.0, 0.2, "the NetworkNotReady events")
        assert sorted(e["involvedObject"]["kind"] for e in events) == ["Node", "Pod"], events
        assert all(e["count"] == 1 for e in events), events  # once each, not once per retry
        assert {s.id for s in ours(cri, {uid})} == dead  # held: no sandbox was tried

        # the network comes: start.sh with CNI on writes the conflist and makes the bridge
        on = subprocess.run(["bash", str(DEPLOY_DIR / "start.sh"), str(without_cni.directory)],
                            capture_output=True, text=True, timeout=120, check=False)
        assert on.returncode == 0, on.stderr
        body = wait_for(lambda: (b := get_pods(port)) and all_running(b, {"own", "host"})
                        and b, 90.0, 0.2, "the held pod Running once the network is ready")
        status = next(p["status"] for p in body["items"] if p["metadata"]["uid"] == uid)
        assert status["podIP"] and status["podIP"] != "127.0.0.1"
        wait_for(lambda: not dead & {s.id for s in ours(cri, {uid})}, 60.0, 0.2,
                 "the dead sandboxes removed")
        [live] = ours(cri, {uid})
        assert live.metadata.attempt == 3  # the largest listed + 1, not a reserved name
        assert wait_for(lambda: http_get_status(port, "/healthz") == (200, "ok"), 30.0, 0.2,
                        "/healthz back to ok")
        assert [e["involvedObject"]["kind"] for e in network_events(handle, "NetworkReady")] \
            == ["Node"]
        assert handle.stop() == 0
        wait_for(lambda: not ours(cri, uids), 60.0, 0.2, "every sandbox removed")
    finally:
        clean(cri, cgroup_root, uids)
        cri.close()
        shutil.rmtree(logs, ignore_errors=True)


def http_get_status(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except (urllib.error.URLError, OSError):
        return 0, ""


def network_events(handle: Any, reason: str) -> list[dict[str, Any]]:
    done = handle.ctl("events", "--json")
    if done.returncode != 0:
        return []
    items: list[dict[str, Any]] = json.loads(done.stdout)["items"]
    return [e for e in items if e.get("reason") == reason]
