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
never the outside. Only the Python standard library: no virtualenv needed (the conflist, the
subnet choice and the iptables cleanup are podvisor's ``common/cninet.py``, loaded by path;
the embedded runtime's network uses the same).
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import sys
from pathlib import Path
from types import ModuleType


def _load_cninet() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "common" / "cninet.py"
    spec = importlib.util.spec_from_file_location("podvisor_cninet", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cninet = _load_cninet()
CONFLIST: str = cninet.CONFLIST
POOL = ipaddress.ip_network("10.200.0.0/13")  # 10.200.0.0 - 10.207.255.255: 2048 /24s
tag_of = cninet.tag_of
used_networks = cninet.used_networks


def pick_subnet(tag: str) -> ipaddress.IPv4Network:
    subnet = cninet.pick_subnet(POOL, tag, used_networks())
    if subnet is None:
        raise SystemExit(f"cni.py: every /24 of {POOL} overlaps a route or address here")
    assert isinstance(subnet, ipaddress.IPv4Network)
    return subnet


def conflist(directory: str, subnet: ipaddress.IPv4Network) -> dict[str, object]:
    conf = cninet.conflist(tag_of(directory), subnet, f"{directory}/cni/ipam")
    assert isinstance(conf, dict)
    return conf


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


def cmd_cleanup(directory: str) -> None:
    try:
        conf = json.loads((Path(directory) / "cni" / "net.d" / CONFLIST).read_text())
    except (OSError, ValueError):
        return
    removed = cninet.remove_port_rules(conf["name"])
    if removed:
        print(f"cni.py: removed {removed} iptables rule(s) of {conf['name']}")


def main(argv: list[str]) -> None:
    commands = {"conflist": cmd_conflist, "show": cmd_show, "cleanup": cmd_cleanup}
    if len(argv) != 2 or argv[0] not in commands:
        raise SystemExit("usage: cni.py conflist|show|cleanup DIR")
    commands[argv[0]](argv[1])


if __name__ == "__main__":
    main(sys.argv[1:])
