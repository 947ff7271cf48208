#!/usr/bin/env python3
"""CNI helpers for podvisor's private containerd instance (called by setup.sh and stop.sh).

    cni.py conflist DIR      write DIR/cni/net.d/10-podvisor.conflist (once: kept if present)
                             and print `BRIDGE=... SUBNET=... GATEWAY=... NETWORK=...`
    cni.py show DIR          print the same line from the existing conflist
    cni.py cleanup DIR       delete the iptables nat rules and chains CNI plugins made for this
                             instance's network (portmap's CNI-DN-* chains, the jumps to them),
                             then portmap's shared CNI-HOSTPORT-* chains if nothing uses them

The network: Debian's containernetworking-plugins (bin dir /usr/lib/cni). containerd itself adds
the `loopback` plugin to every pod; the conflist has `bridge` (host-local IPAM, its state under
DIR/cni/ipam) and `portmap` (hostPort). The bridge is `pv<tag>` with gateway .1 of a /24 in
10.200.0.0/13 that no route or address of this machine overlaps when the conflist is first
written (<tag>: 8 hex digits of sha256(DIR), which also seeds the /24). `isGateway: false` and
`ipMasq: false`: the plugin neither enables IP forwarding nor masquerades, and pods get no
default route: they reach this machine (the bridge address, which start.sh sets) and each other,
never the outside. Only the Python standard library: no virtualenv needed.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

CONFLIST = "10-podvisor.conflist"
POOL = ipaddress.ip_network("10.200.0.0/13")  # 10.200.0.0 - 10.207.255.255: 2048 /24s
HOSTPORT_CHAINS = ("CNI-HOSTPORT-DNAT", "CNI-HOSTPORT-MASQ", "CNI-HOSTPORT-SETMARK")


def tag_of(directory: str) -> str:
    return hashlib.sha256(directory.encode()).hexdigest()[:8]


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 route and interface network of this machine (the default route excluded)."""
    out: list[ipaddress.IPv4Network] = []
    for cmd in (["ip", "-4", "-o", "route", "show", "table", "all"], ["ip", "-4", "-o", "addr"]):
        text = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
        for word in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\b", text):
            net = ipaddress.ip_network(word, strict=False)
            if isinstance(net, ipaddress.IPv4Network) and net.prefixlen > 0:
                out.append(net)
    return out


def pick_subnet(tag: str) -> ipaddress.IPv4Network:
    subnets = list(POOL.subnets(new_prefix=24))
    used = _used_networks()
    start = int(tag, 16) % len(subnets)
    for i in range(len(subnets)):
        candidate = subnets[(start + i) % len(subnets)]
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise SystemExit(f"cni.py: every /24 of {POOL} overlaps a route or address here")


def conflist(directory: str, subnet: ipaddress.IPv4Network) -> dict[str, object]:
    tag = tag_of(directory)
    gateway = str(subnet.network_address + 1)
    return {
        "cniVersion": "1.0.0",
        "name": f"podvisor-{tag}",
        "plugins": [
            {"type": "bridge", "bridge": f"pv{tag}", "isGateway": False, "ipMasq": False,
             "hairpinMode": True,
             "ipam": {"type": "host-local", "dataDir": f"{directory}/cni/ipam",
                      "ranges": [[{"subnet": str(subnet), "gateway": gateway}]]}},
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        ],
    }


def describe(conf: dict[str, object]) -> str:
    plugins = conf["plugins"]
    assert isinstance(plugins, list)
    bridge = plugins[0]
    rng = bridge["ipam"]["ranges"][0][0]
    return (f"BRIDGE={bridge['bridge']} SUBNET={rng['subnet']} GATEWAY={rng['gateway']} "
            f"NETWORK={conf['name']}")


def cmd_conflist(directory: str) -> None:
    path = Path(directory) / "cni" / "net.d" / CONFLIST
    if path.is_file():
        conf = json.loads(path.read_text())
    else:
        conf = conflist(directory, pick_subnet(tag_of(directory)))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(conf, indent=2) + "\n")
        tmp.rename(path)
    print(describe(conf))


def cmd_show(directory: str) -> None:
    print(describe(json.loads((Path(directory) / "cni" / "net.d" / CONFLIST).read_text())))


def _iptables(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["iptables", "-w", "5", "-t", "nat", *args], capture_output=True,
                          text=True, check=False)


def _rules() -> list[str]:
    done = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True,
                          check=False)
    return [line for line in done.stdout.splitlines() if line.startswith("-A ")]


def _delete(rule: str) -> None:
    _iptables("-D", *_split(rule[3:]))


def _split(rule: str) -> list[str]:
    return shlex.split(rule)


def _target(rule: str) -> str:
    parts = _split(rule)
    return parts[parts.index("-j") + 1] if "-j" in parts else ""


def _drop_chain(chain: str) -> None:
    for rule in _rules():  # every jump to it first, then the chain
        if _target(rule) == chain:
            _delete(rule)
    _iptables("-F", chain)
    _iptables("-X", chain)


def cmd_cleanup(directory: str) -> None:
    try:
        conf = json.loads((Path(directory) / "cni" / "net.d" / CONFLIST).read_text())
    except (OSError, ValueError):
        return
    if subprocess.run(["sh", "-c", "command -v iptables-save"], capture_output=True,
                      check=False).returncode:
        return
    marker = f'name: \\"{conf["name"]}\\"'
    ours = [rule for rule in _rules() if marker in rule]
    chains = {_target(rule) for rule in ours}
    for rule in ours:
        _delete(rule)
    for chain in sorted(c for c in chains if c.startswith("CNI-") and c not in HOSTPORT_CHAINS):
        _drop_chain(chain)
    rules = _rules()
    if not any(_split(r[3:])[0].startswith("CNI-DN-") for r in rules):
        # no port mapping of any network is left: portmap's shared chains can go too
        for chain in HOSTPORT_CHAINS:
            _drop_chain(chain)
    removed = len(ours)
    if removed:
        print(f"cni.py: removed {removed} iptables rule(s) of {conf['name']}")


def main(argv: list[str]) -> None:
    commands = {"conflist": cmd_conflist, "show": cmd_show, "cleanup": cmd_cleanup}
    if len(argv) != 2 or argv[0] not in commands:
        raise SystemExit("usage: cni.py conflist|show|cleanup DIR")
    commands[argv[0]](argv[1])


if __name__ == "__main__":
    main(sys.argv[1:])
