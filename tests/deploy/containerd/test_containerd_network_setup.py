"""deploy/containerd's pod network (cni.py, setup.sh, start.sh, stop.sh).

- cni.py (no root): the conflist it writes (bridge that never enables forwarding or masquerades,
  host-local IPAM under the instance dir, portmap), a /24 no route or address here overlaps, the
  same conflist on a second run.
- The scripts (root, containerd and the CNI plugins installed; else skipped with the reason):
  a private instance with a pod that has its own IP and a hostPort, then `stop.sh --purge`
  WITHOUT stopping the pod (as after a crash): the bridge, portmap's iptables rules of the
  instance's network, the network namespace mounts and the directory are all gone.
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import new_runtime_client
from tests.support.containerd import DEPLOY_DIR

CNI_BIN = Path("/usr/lib/cni")


def load_cni() -> ModuleType:
    spec = importlib.util.spec_from_file_location("podvisor_deploy_cni", DEPLOY_DIR / "cni.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_conflist_is_a_local_bridge_on_a_free_subnet(tmp_path: Path, monkeypatch: Any,
                                                      capsys: Any) -> None:
    cni = load_cni()
    tag = cni.tag_of(str(tmp_path))
    subnets = list(cni.POOL.subnets(new_prefix=24))
    first = subnets[int(tag, 16) % len(subnets)]
    # the /24 the tag picks first is in use here (a route covering it): the next one is taken
    monkeypatch.setattr(cni, "used_networks", lambda: [first.supernet(new_prefix=23),
                                                        ipaddress.ip_network("192.0.2.0/24")])
    cni.cmd_conflist(str(tmp_path))
    line = capsys.readouterr().out.split()
    values = dict(word.split("=", 1) for word in line)
    subnet = ipaddress.ip_network(values["SUBNET"])
    assert subnet.prefixlen == 24 and subnet.subnet_of(cni.POOL)
    assert not subnet.overlaps(first.supernet(new_prefix=23))
    conf = json.loads((tmp_path / "cni/net.d/10-podvisor.conflist").read_text())
    bridge, portmap = conf["plugins"]
    assert values == {"BRIDGE": f"pv{tag}", "SUBNET": str(subnet),
                      "GATEWAY": str(subnet.network_address + 1), "NETWORK": f"podvisor-{tag}"}
    assert (bridge["type"], bridge["bridge"], bridge["isGateway"], bridge["ipMasq"]) == \
        ("bridge", f"pv{tag}", False, False)  # no forwarding, no masquerade
    assert bridge["ipam"]["dataDir"] == f"{tmp_path}/cni/ipam"
    assert "routes" not in bridge["ipam"]  # no default route: pods reach this machine only
    assert portmap == {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True}
    assert len(f"pv{tag}") <= 15  # IFNAMSIZ
    monkeypatch.setattr(cni, "used_networks", lambda: [])
    cni.cmd_conflist(str(tmp_path))  # idempotent: the existing conflist is kept
    assert capsys.readouterr().out.split() == line


def _skip_unless_scripts_can_run() -> None:
    if os.geteuid() != 0:
        pytest.skip(f"the containerd scripts need root (euid {os.geteuid()})")
    missing = [t for t in ("containerd", "ctr", "runc", "iptables-save", "ip")
               if shutil.which(t) is None]
    missing += [f"{CNI_BIN}/{p}" for p in ("bridge", "host-local", "portmap", "loopback")
                if not (CNI_BIN / p).exists()]
    if missing:
        pytest.skip(f"missing {', '.join(missing)} (run deploy/containerd/setup.sh as root)")


def _script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(DEPLOY_DIR / name), *args], capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.mark.containerd
@pytest.mark.timeout(240)
def test_stop_purge_removes_bridge_rules_and_netns_of_a_crashed_pod() -> None:
    _skip_unless_scripts_can_run()
    directory = Path(tempfile.mkdtemp(prefix="pvnet-", dir="/tmp"))
    pid = 0
    try:
        setup = _script("setup.sh", "--no-install", str(directory))
        assert setup.returncode == 0, setup.stderr
        start = _script("start.sh", str(directory))
        assert start.returncode == 0, start.stderr
        pid = int((directory / "containerd.pid").read_text())
        env = dict(line.split("=", 1) for line in
                   (directory / "instance.env").read_text().splitlines())
        cri = new_runtime_client(env["ENDPOINT"], timeout=60.0)
        uid = uuid.uuid4().hex
        try:
            sid = cri.run_pod_sandbox(pb.PodSandboxConfig(
                metadata=pb.PodSandboxMetadata(name="net", uid=uid, namespace="default"),
                hostname="net", log_directory=str(directory / "logs"),
                port_mappings=[pb.PortMapping(protocol=pb.TCP, container_port=8080,
                                              host_port=39411)],
                linux=pb.LinuxPodSandboxConfig(
                    cgroup_parent=f"{env['CGROUP_PARENT']}/pod{uid}",
                    security_context=pb.LinuxSandboxSecurityContext(
                        namespace_options=pb.NamespaceOption(network=pb.POD,
                                                             pid=pb.CONTAINER)))))
            ip = cri.pod_sandbox_status(sid).network.ip
        finally:
            cri.close()
        assert ipaddress.ip_address(ip) in ipaddress.ip_network(env["SUBNET"])
        assert env["NETWORK"] in _nat_rules()
        assert _bridge_exists(env["BRIDGE"])
        assert _mounts_under(directory), "the pod's netns is not under the instance dir"
        stop = _script("stop.sh", "--purge", str(directory))  # the sandbox still runs
        assert stop.returncode == 0, stop.stderr
        assert f"removed bridge {env['BRIDGE']}" in stop.stdout
        assert env["NETWORK"] not in _nat_rules()
        assert "--dport 39411" not in _nat_rules()
        assert not _bridge_exists(env["BRIDGE"])
        assert not _mounts_under(directory) and not directory.exists()
    finally:
        if directory.exists():
            _script("stop.sh", "--purge", str(directory))
        if pid:  # pytest is a subreaper: containerd was re-parented to it
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _nat_rules() -> str:
    return subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True,
                          check=False).stdout


def _bridge_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True,
                          check=False).returncode == 0


def _mounts_under(directory: Path) -> list[str]:
    prefix = f"{directory}/"
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split()[4].startswith(prefix)]
