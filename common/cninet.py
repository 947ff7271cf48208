"""The bridge network podvisor writes for its pods, shared by the embedded runtime
(``services/runtime/cni.py``) and the private containerd instances of ``deploy/containerd``
(``cni.py`` there loads this file by path: the standard library only, no virtualenv).

- ``conflist``: a bridge ``pv<tag>`` that never enables IP forwarding nor masquerades (pods
  reach this machine and each other, nothing beyond), host-local addresses in one /24, and
  portmap for hostPort (``snat``: 127.0.0.1:<hostPort> works from the host).
- ``pick_subnet``: a /24 of a pool that no route or address of this machine overlaps, the
  directory's tag choosing where to start looking.
- ``remove_port_rules``: portmap's iptables rules that name a network (and their ``CNI-DN-*``
  chains), then the shared ``CNI-HOSTPORT-*`` chains once no network has a mapping left.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import re
import shlex
import shutil
import subprocess
from typing import Any

CONFLIST = "10-podvisor.conflist"
HOSTPORT_CHAINS = ("CNI-HOSTPORT-DNAT", "CNI-HOSTPORT-MASQ", "CNI-HOSTPORT-SETMARK")


def tag_of(directory: str) -> str:
    """8 hex digits naming a directory's network (its bridge ``pv<tag>`` fits IFNAMSIZ)."""
    return hashlib.sha256(directory.encode()).hexdigest()[:8]


def used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 route and interface network of this machine (the default route excluded)."""
    out: list[ipaddress.IPv4Network] = []
    for cmd in (["ip", "-4", "-o", "route", "show", "table", "all"], ["ip", "-4", "-o", "addr"]):
        with contextlib.suppress(OSError):
            text = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
            for word in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\b", text):
                net = ipaddress.ip_network(word, strict=False)
                if isinstance(net, ipaddress.IPv4Network) and net.prefixlen > 0:
                    out.append(net)
    return out


def pick_subnet(pool: ipaddress.IPv4Network, tag: str,
                used: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network | None:
    """A /24 of ``pool`` that none of ``used`` overlaps, looking from the one ``tag`` picks
    (None: every one overlaps)."""
    subnets = list(pool.subnets(new_prefix=24))
    start = int(tag, 16) % len(subnets)
    for i in range(len(subnets)):
        candidate = subnets[(start + i) % len(subnets)]
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    return None


def conflist(tag: str, subnet: ipaddress.IPv4Network, ipam_dir: str) -> dict[str, Any]:
    """The network ``podvisor-<tag>`` on bridge ``pv<tag>`` (gateway: .1 of ``subnet``, which
    the runtime sets on the bridge itself; ``isGateway: false``)."""
    return {
        "cniVersion": "1.0.0",
        "name": f"podvisor-{tag}",
        "plugins": [
            {"type": "bridge", "bridge": f"pv{tag}", "isGateway": False, "ipMasq": False,
             "hairpinMode": True,
             "ipam": {"type": "host-local", "dataDir": ipam_dir,
                      "ranges": [[{"subnet": str(subnet),
                                   "gateway": str(subnet.network_address + 1)}]]}},
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        ],
    }


def _nat_rules() -> list[str]:
    done = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True,
                          check=False)
    return [line for line in done.stdout.splitlines() if line.startswith("-A ")]


def _nat(*args: str) -> None:
    subprocess.run(["iptables", "-w", "5", "-t", "nat", *args], capture_output=True,
                   check=False)


def _target(rule: str) -> str:
    parts = shlex.split(rule)
    return parts[parts.index("-j") + 1] if "-j" in parts else ""


def _drop_chain(chain: str) -> None:
    for rule in _nat_rules():  # every jump to it first, then the chain
        if _target(rule) == chain:
            _nat("-D", *shlex.split(rule[3:]))
    _nat("-F", chain)
    _nat("-X", chain)


def remove_port_rules(network: str) -> int:
    """Delete portmap's nat rules naming ``network`` and the chains they jump to, then the
    shared hostport chains when no ``CNI-DN-*`` rule of any network is left; the number of
    rules of ``network`` removed (0 without iptables)."""
    if shutil.which("iptables-save") is None:
        return 0
    marker = f'name: \\"{network}\\"'
    ours = [rule for rule in _nat_rules() if marker in rule]
    chains = {_target(rule) for rule in ours}
    for rule in ours:
        _nat("-D", *shlex.split(rule[3:]))
    for chain in sorted(c for c in chains if c.startswith("CNI-") and c not in HOSTPORT_CHAINS):
        _drop_chain(chain)
    if not any(shlex.split(r[3:])[0].startswith("CNI-DN-") for r in _nat_rules()):
        for chain in HOSTPORT_CHAINS:
            _drop_chain(chain)
    return len(ours)
