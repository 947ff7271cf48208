"""The embedded runtime's pod network (``networkPlugin: cni``; services/runtime/cni.py, netns.py):
a real standalone runtime, Debian's CNI plugins (bridge + host-local + portmap), real network
namespaces. Each sandbox that asks for its own network gets a namespace and an IP; two pods
listen on one port side by side; a hostPort reaches its pod on 127.0.0.1; ExecSync and port
forward run inside the pod's namespace; the C and the Python monitor both join it. Teardown is
idempotent, and a runtime killed at each step of a setup or a teardown leaves nothing behind
once it is back (engine.py ``NETWORK_STEPS``).

Root and the plugins are needed (skipped otherwise). Each test removes what it made by name:
its sandboxes through CRI, then its network's iptables rules and bridge (``remove_network``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.common.crashpoints import ENV_AT, ENV_ONCE_DIR
from podvisor.services.cri import CriError
from podvisor.services.runtime import netns
from podvisor.services.runtime.cni import CONFLIST, remove_network
from podvisor.services.runtime.engine import NETWORK_STEPS
from tests.services.conftest import EmbeddedRuntime, poll, short_tmp
from tests.support.spdy_client import spdy_port_forward

PLUGINS = Path("/usr/lib/cni")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all((PLUGINS / p).exists() for p in ("bridge", "host-local",
                                                                  "portmap", "loopback"))
    or shutil.which("iptables-save") is None,
    reason="needs root, iptables and containernetworking-plugins in /usr/lib/cni "
           "(bash .ci/test-deps.sh)")

# A TCP server: answers each connection with its NAME, the address it was reached on, then
# closes (``BIND`` 0.0.0.0, or 127.0.0.1 to be reachable only from inside the namespace).
SERVER = """
import socket, sys
name, bind, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((bind, port)); s.listen(16)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(f"{name} {c.getsockname()[0]}\\n".encode()); c.close()
"""


class NetRuntime(EmbeddedRuntime):
    """The standalone runtime with ``--network-plugin cni`` and a conf dir of its own."""

    def __init__(self, base: Path, env: dict[str, str] | None = None) -> None:
        super().__init__(base, env)
        self.conf_dir = base / "net.d"

    def launch(self, env: dict[str, str] | None = None) -> None:
        with self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "podvisor.services.runtime", "--root", str(self.root),
                 "--socket", str(self.socket), "--network-plugin", "cni",
                 "--cni-conf-dir", str(self.conf_dir), "--cni-bin-dir", str(PLUGINS)],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                env=self.env if env is None else env)

    def conflist(self) -> dict[str, Any]:
        return dict(json.loads((self.conf_dir / CONFLIST).read_text()))

    def leftovers(self) -> dict[str, list[str]]:
        """What a network setup leaves on disk: attachments, namespace files, IPAM leases."""
        ipam = self.root / "network" / "ipam"
        leases = [p.name for p in ipam.rglob("*") if p.is_file()
                  and p.name[0].isdigit()] if ipam.exists() else []
        return {"attachments": sorted(p.name for p in (self.root / "network").glob("*.json")),
                "netns": sorted(p.name for p in (self.root / "netns").glob("*")),
                "leases": sorted(leases)}


def nat_rules_naming(text: str) -> list[str]:
    out = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if text in line]


@contextlib.contextmanager
def net_runtime(env: dict[str, str] | None = None) -> Iterator[NetRuntime]:
    base = short_tmp("pvnet")
    rt = NetRuntime(base, env)
    conf: dict[str, Any] | None = None
    leftover: list[Path] = []
    try:
        rt.start()
        yield rt
    finally:
        try:
            if rt.proc is None:
                rt.env.pop(ENV_AT, None)
                rt.start()
            for sb in rt.client.list_pod_sandbox():
                for c in rt.client.list_containers(pb.ContainerFilter(pod_sandbox_id=sb.id)):
                    rt.client.stop_container(c.id, 0)
                    rt.client.remove_container(c.id)
                rt.client.stop_pod_sandbox(sb.id)
                rt.client.remove_pod_sandbox(sb.id)
            with contextlib.suppress(OSError, ValueError):
                conf = rt.conflist()
        finally:
            rt.stop()
            rt.client.close()
            if conf is not None:
                remove_network(conf)
                bridge = conf["plugins"][0]["bridge"]
                assert subprocess.run(["ip", "link", "show", bridge], capture_output=True,
                                      check=False).returncode != 0, f"{bridge} left behind"
            leftover = list(netns.listed(rt.root / "netns"))
            for path in leftover:  # only after a failure: a mounted namespace stops rmtree
                netns.remove(path)
            shutil.rmtree(base, ignore_errors=True)
        if sys.exc_info()[0] is None:  # never hide the test's own failure
            assert not leftover, f"namespaces left behind: {leftover}"


def sandbox_config(rt: NetRuntime, name: str, *, host_network: bool = False,
                   host_port: int = 0, port: int = 8080,
                   host_ip: str = "") -> pb.PodSandboxConfig:
    logs = rt.base / "logs" / name
    logs.mkdir(parents=True, exist_ok=True)
    ns = pb.NamespaceOption(network=pb.NODE if host_network else pb.POD, pid=pb.CONTAINER)
    ports = [pb.PortMapping(protocol=pb.TCP, container_port=port, host_port=host_port,
                            host_ip=host_ip)] if host_port else []
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace="net", uid=f"uid-{name}",
                                       attempt=0),
        log_directory=str(logs), port_mappings=ports,
        linux=pb.LinuxPodSandboxConfig(
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=ns)))


def serve(rt: NetRuntime, name: str, *, bind: str = "0.0.0.0", port: int = 8080,
          host_network: bool = False, host_port: int = 0,
          host_ip: str = "") -> tuple[str, str]:
    """A sandbox with SERVER in it, listening; (sandbox ID, container ID)."""
    sconfig = sandbox_config(rt, name, host_network=host_network, host_port=host_port,
                             port=port, host_ip=host_ip)
    sid = rt.client.run_pod_sandbox(sconfig)
    config = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="srv"), image=pb.ImageSpec(image="host"),
        command=[sys.executable, "-c", SERVER, name, bind, str(port)], log_path="srv.log")
    cid = rt.client.create_container(sid, config, sconfig)
    rt.client.start_container(cid)
    log = rt.base / "logs" / name / "srv.log"
    poll(lambda: log.exists() and "listening" in log.read_text(), 30.0,
         f"{name}'s server to listen")
    return sid, cid


def ask(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=10) as conn:
        return conn.recv(200).decode().strip()


def ip_of(rt: NetRuntime, sid: str) -> str:
    return str(rt.client.pod_sandbox_status(sid).network.ip)


@pytest.mark.parametrize("monitor", ["c", "python"])
def test_pods_get_their_own_network(monitor: str) -> None:
    env = {"PODVISOR_MONITOR": "python"} if monitor == "python" else None
    with net_runtime(env) as rt:
        status = rt.client.status()
        network = {c.type: c for c in status.status.conditions}["NetworkReady"]
        assert network.status, network
        (a, ca), (b, _) = serve(rt, "a"), serve(rt, "b")
        ips = ip_of(rt, a), ip_of(rt, b)
        subnet = rt.conflist()["plugins"][0]["ipam"]["ranges"][0][0]["subnet"]
        assert ips[0] != ips[1] and all(ip.startswith(subnet.rsplit(".", 1)[0]) for ip in ips)
        # the same port in both, each reached on its own IP
        assert ask(ips[0], 8080) == f"a {ips[0]}"
        assert ask(ips[1], 8080) == f"b {ips[1]}"
        # ExecSync runs in the pod's namespace: it sees the pod's address, not the host's
        out = rt.client.exec_sync(ca, ["ip", "-o", "-4", "addr", "show", "dev", "eth0"], 10)
        assert out.exit_code == 0 and f" {ips[0]}/" in out.stdout.decode(), out
        # a hostNetwork sandbox has no namespace and no IP of its own (the node's)
        h = rt.client.run_pod_sandbox(sandbox_config(rt, "h", host_network=True))
        assert ip_of(rt, h) == ""
        assert rt.leftovers()["netns"] == sorted([a, b])


def test_host_port_and_port_forward_reach_the_pod() -> None:
    with net_runtime() as rt:
        serve(rt, "other")
        sid, _ = serve(rt, "hp", host_port=18080)
        ip = ip_of(rt, sid)
        assert ask("127.0.0.1", 18080) == f"hp {ip}"
        rules = nat_rules_naming(sid)
        assert rules, "portmap's rules name the sandbox"
        # a server on the pod's own localhost: only port forward (inside the namespace) sees it
        inner, _ = serve(rt, "inner", bind="127.0.0.1", port=9090)
        with pytest.raises(OSError):
            ask(ip_of(rt, inner), 9090)
        url = rt.client.port_forward(pb.PortForwardRequest(pod_sandbox_id=inner, port=[9090]))
        got = asyncio.run(spdy_port_forward(str(url), 9090, b"hi\n"))
        assert got.error == b"" and got.stdout.decode().strip() == "inner 127.0.0.1", got
        # stop: the namespace, the attachment, the lease and the rules go; again is a no-op
        rt.client.stop_pod_sandbox(sid)
        assert sid not in rt.leftovers()["netns"] + rt.leftovers()["attachments"]
        assert nat_rules_naming(sid) == []
        with pytest.raises(OSError):
            ask("127.0.0.1", 18080)
        rt.client.stop_pod_sandbox(sid)
        rt.client.remove_pod_sandbox(sid)
        assert len(rt.leftovers()["leases"]) == 2  # the other two pods'


def test_host_ip_binds_the_host_port_to_that_address() -> None:
    """ports[].hostIP (issue 24): in networkPlugin: cni the host port is DNATed on that address
    only (portmap's rule matches -d hostIP), as containerd does; the host-network mode refuses
    it (test_contract_security test_embedded_refuses_port_mappings_it_cannot_make)."""
    with net_runtime() as rt:
        sid, _ = serve(rt, "bound", host_port=18082, host_ip="127.0.0.1")
        assert ask("127.0.0.1", 18082) == f"bound {ip_of(rt, sid)}"
        dnat = [r for r in nat_rules_naming("--dport 18082") if "-j DNAT" in r]
        assert dnat and all("-d 127.0.0.1/32" in r for r in dnat), dnat
        rt.client.stop_pod_sandbox(sid)
        assert nat_rules_naming("--dport 18082") == []


def test_network_not_ready_without_plugins() -> None:
    with net_runtime() as rt:
        rt.stop()
        rt.conf_dir.mkdir(parents=True, exist_ok=True)
        (rt.conf_dir / "00-missing.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "missing", "plugins": [{"type": "no-such-plugin"}]}))
        rt.start()
        conds = {c.type: c for c in rt.client.status().status.conditions}
        assert not conds["NetworkReady"].status
        assert conds["NetworkReady"].reason == "NetworkPluginNotReady"
        assert "no-such-plugin" in conds["NetworkReady"].message
        with pytest.raises(CriError) as info:
            rt.client.run_pod_sandbox(sandbox_config(rt, "x"))
        assert "failed to setup network" in str(info.value)
        assert rt.leftovers() == {"attachments": [], "netns": [], "leases": []}
        assert rt.client.list_pod_sandbox() == []
        (rt.conf_dir / "00-missing.conflist").unlink()


SETUP_STEPS = ("network.after_record", "network.after_setup")


@pytest.mark.parametrize("step", NETWORK_STEPS)
def test_runtime_killed_mid_network_leaves_nothing(step: str) -> None:
    base_once = short_tmp("pvnetonce")
    env = {ENV_AT: f"runtime:{step}", ENV_ONCE_DIR: str(base_once)}
    try:
        with net_runtime(env) as rt:
            config = sandbox_config(rt, "k", host_port=18081)
            if step in SETUP_STEPS:
                with pytest.raises(CriError):
                    rt.client.run_pod_sandbox(config)
            else:
                sid = rt.client.run_pod_sandbox(config)
                with pytest.raises(CriError):
                    rt.client.stop_pod_sandbox(sid)
            assert rt.wait_died() == -signal.SIGKILL, rt.stderr()
            rt.start()
            # the new runtime swept what the killed one was making or unmaking
            assert rt.leftovers() == {"attachments": [], "netns": [], "leases": []}, step
            if (rt.conf_dir / CONFLIST).exists():  # else no plugin ever ran
                assert nat_rules_naming(rt.conflist()["name"]) == []
            boxes = rt.client.list_pod_sandbox()
            if step in SETUP_STEPS:  # never answered: gone, and the same name runs again
                assert boxes == []
                sid = rt.client.run_pod_sandbox(config)
                assert ip_of(rt, sid)
            else:  # stopped: NOTREADY, and stopping/removing again is fine
                assert [b.state for b in boxes] == [pb.SANDBOX_NOTREADY]
                rt.client.stop_pod_sandbox(boxes[0].id)
                rt.client.remove_pod_sandbox(boxes[0].id)
    finally:
        shutil.rmtree(base_once, ignore_errors=True)


def test_unique_names() -> None:
    """The network and bridge names are per runtime root (two roots never share one)."""
    from podvisor.services.runtime.cni import tag_of
    assert tag_of(f"/tmp/{uuid.uuid4().hex}") != tag_of(f"/tmp/{uuid.uuid4().hex}")
