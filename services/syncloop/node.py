"""What the node adds to the downward API (``NodeFacts``), read once at the edge.

- Allocatable CPU and memory, the kubelet's defaults for an unset limit in ``resourceFieldRef``
  and the memory capacity in the OOM score of Burstable containers: podvisor reserves nothing
  for the system, so allocatable = capacity = the machine's CPUs (``os.cpu_count``, as
  cAdvisor's NumCores) x 1000 millicores and ``MemTotal`` from /proc/meminfo.
- Allocatable ephemeral-storage, the default for an unset ``limits.ephemeral-storage`` in
  ``resourceFieldRef``: the size of the filesystem holding ``rootDir`` (the node process's
  capacity, ``node/status.py``) less kubeReserved, systemReserved and ``nodefs.available``
  (``ephemeral_storage_allocatable``: the Node's allocatable).
- The host's IPs (``status.hostIP(s)``): ``nodeIP``'s addresses when set (the Node's
  InternalIPs, as the kubelet's); else the config's ``address`` when it is a concrete IP (the
  status process reports the same ones as ``status.hostIP(s)``, so env and ``/pods`` agree);
  else, as the kubelet without ``--node-ip``: the node name's addresses from DNS that are not
  loopback or link-local, else the address of the interface holding the default route, else
  127.0.0.1.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from decimal import Decimal
from pathlib import Path

from podvisor.common.allocatable import allocatable
from podvisor.common.config import Config
from podvisor.services.pod import NodeFacts
from podvisor.services.syncloop.admission import Capacity

_FALLBACK_MEMORY = 1 << 30


def memory_total(meminfo: str) -> int:
    """``MemTotal`` in bytes from a /proc/meminfo text (0 when absent)."""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) >= 2 and parts[1].isdigit() else 0
    return 0


def _usable(ip: str) -> bool:
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return not (addr.is_loopback or addr.is_link_local or addr.is_multicast
                or addr.is_unspecified)


def host_ips(address: str, node_name: str) -> tuple[str, ...]:
    if _usable(address) or address == "127.0.0.1":
        return (address,)
    try:
        found = [str(info[4][0]) for info in socket.getaddrinfo(node_name, None,
                                                                socket.AF_INET)]
    except (OSError, UnicodeError):
        found = []
    for ip in found:
        if _usable(ip):
            return (ip,)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: routing only, nothing is sent
            ip = str(s.getsockname()[0])
        if _usable(ip):
            return (ip,)
    except OSError:
        pass
    return ("127.0.0.1",)


def discover_node_facts(address: str = "127.0.0.1", node_name: str = "",
                        node_ips: tuple[str, ...] = ()) -> NodeFacts:
    cpus = os.cpu_count() or 1
    try:
        memory = memory_total(Path("/proc/meminfo").read_text())
    except OSError:
        memory = 0
    return NodeFacts(cpu_millis=cpus * 1000, memory_bytes=memory or _FALLBACK_MEMORY,
                     host_ips=node_ips or host_ips(address,
                                                   node_name or socket.gethostname()))


def admission_capacity(node: NodeFacts, config: Config) -> Capacity:
    """The Node's allocatable CPU and memory (the node process reports the same arithmetic,
    ``common/allocatable.py``: less kubeReserved, systemReserved and evictionHard), and
    ``maxPods``: what a pod is admitted against."""
    left = allocatable({"cpu": Decimal(node.cpu_millis) / 1000,
                        "memory": Decimal(node.memory_bytes)},
                       config.kube_reserved, config.system_reserved, config.eviction_hard)
    return Capacity(int(left["cpu"] * 1000), int(left["memory"]), config.max_pods)


def ephemeral_storage_allocatable(root_dir: str, config: Config) -> int | None:
    """The Node's allocatable ephemeral-storage in bytes (None when ``root_dir``'s filesystem
    cannot be read)."""
    try:
        st = os.statvfs(root_dir if os.path.exists(root_dir) else "/")
    except OSError:
        return None
    left = allocatable({"ephemeral-storage": Decimal(st.f_blocks * st.f_frsize)},
                       config.kube_reserved, config.system_reserved, config.eviction_hard)
    return int(left["ephemeral-storage"])
