"""A pod's DNS and host names: ``hostname``, ``subdomain``, ``setHostnameAsFQDN``,
``hostAliases`` and ``dnsConfig`` (``dnsPolicy`` is PodSpec's). ``PodDNS`` is the model (kept in
the wire form as the manifest wrote it), ``parse_pod_dns`` validates as the API server
(``validateHostAliases``, ``validatePodDNSConfig``, the DNS-1123 labels of hostname and
subdomain) and ``pod_dns_from_wire`` rebuilds it. What the kubelet does with it (resolv.conf,
the hostname, /etc/hosts) is the sync loop's (syncloop/dns.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podvisor.services.pod.fields import (
    Findings,
    as_map,
    check_fields,
    get_bool,
    get_list,
    get_str,
    get_str_list,
    join,
)
from podvisor.services.pod.names import dns1123_label, dns1123_subdomain

MAX_NAMESERVERS = 3  # the API server's MaxDNSNameservers
MAX_SEARCHES = 32  # MaxDNSSearchPaths (ExpandedDNSConfig, GA)
MAX_SEARCH_CHARS = 2048  # MaxDNSSearchListChars


@dataclass(frozen=True)
class DNSOption:
    name: str
    value: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name} if self.value is None else {"name": self.name,
                                                               "value": self.value}


@dataclass(frozen=True)
class PodDNSConfig:
    nameservers: tuple[str, ...] = ()
    searches: tuple[str, ...] = ()
    options: tuple[DNSOption, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.nameservers:
            out["nameservers"] = list(self.nameservers)
        if self.searches:
            out["searches"] = list(self.searches)
        if self.options:
            out["options"] = [o.to_dict() for o in self.options]
        return out


@dataclass(frozen=True)
class HostAlias:
    ip: str
    hostnames: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"ip": self.ip, "hostnames": list(self.hostnames)}


@dataclass(frozen=True)
class PodDNS:
    hostname: str = ""
    subdomain: str = ""
    set_hostname_as_fqdn: bool = False
    host_aliases: tuple[HostAlias, ...] = ()
    config: PodDNSConfig | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.hostname:
            out["hostname"] = self.hostname
        if self.subdomain:
            out["subdomain"] = self.subdomain
        if self.set_hostname_as_fqdn:
            out["setHostnameAsFQDN"] = True
        if self.host_aliases:
            out["hostAliases"] = [a.to_dict() for a in self.host_aliases]
        if self.config is not None:
            out["dnsConfig"] = self.config.to_dict()
        return out


def _ip(f: Findings, value: str, where: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        f.error(where, f"Invalid value: {value!r}: must be a valid IP address")
        return False
    return True


def _label(f: Findings, m: Mapping[str, Any], key: str, path: str) -> str:
    value = get_str(f, m, key, path)
    if value and (why := dns1123_label(value)) is not None:
        f.error(join(path, key), why)
        return ""
    return value


def _aliases(f: Findings, m: Mapping[str, Any], path: str) -> tuple[HostAlias, ...]:
    out = []
    for where, raw in get_list(f, m, "hostAliases", path):
        a = as_map(f, raw, where)
        if a is None:
            continue
        check_fields(f, a, where, ("ip", "hostnames"), {})
        ip = get_str(f, a, "ip", where)
        if not ip:
            f.error(join(where, "ip"), "Required value")
            continue
        if not _ip(f, ip, join(where, "ip")):
            continue
        names = get_str_list(f, a, "hostnames", where)
        for i, name in enumerate(names):
            if (why := dns1123_subdomain(name)) is not None:
                f.error(f"{join(where, 'hostnames')}[{i}]", why)
        out.append(HostAlias(ip, tuple(names)))
    return tuple(out)


def _config(f: Findings, m: Mapping[str, Any], path: str, policy_none: bool
            ) -> PodDNSConfig | None:
    where = join(path, "dnsConfig")
    raw = m.get("dnsConfig")
    if raw is None:
        if policy_none:
            f.error(where, "Required value: must provide `dnsConfig` when `dnsPolicy` is None")
        return None
    c = as_map(f, raw, where)
    if c is None:
        return None
    check_fields(f, c, where, ("nameservers", "searches", "options"), {})
    servers = get_str_list(f, c, "nameservers", where)
    if policy_none and not servers:
        f.error(join(where, "nameservers"), "Required value: must provide at least one DNS "
                                            "nameserver when `dnsPolicy` is None")
    if len(servers) > MAX_NAMESERVERS:
        f.error(join(where, "nameservers"), f"Invalid value: {servers!r}: must not have more "
                                            f"than {MAX_NAMESERVERS} nameservers")
    for i, ip in enumerate(servers):
        _ip(f, ip, f"{join(where, 'nameservers')}[{i}]")
    searches = get_str_list(f, c, "searches", where)
    if len(searches) > MAX_SEARCHES:
        f.error(join(where, "searches"), f"Invalid value: {searches!r}: must not have more "
                                         f"than {MAX_SEARCHES} search paths")
    if len(" ".join(searches)) > MAX_SEARCH_CHARS:
        f.error(join(where, "searches"), f"Invalid value: {searches!r}: must not have more "
                                         f"than {MAX_SEARCH_CHARS} characters (including "
                                         "spaces) in the search list")
    for i, s in enumerate(searches):
        name = s.removesuffix(".")  # a trailing dot is allowed (an absolute name)
        if (why := dns1123_subdomain(name)) is not None:
            f.error(f"{join(where, 'searches')}[{i}]", why)
    options = []
    for owhere, raw_opt in get_list(f, c, "options", where):
        o = as_map(f, raw_opt, owhere)
        if o is None:
            continue
        check_fields(f, o, owhere, ("name", "value"), {})
        name = get_str(f, o, "name", owhere)
        if not name:
            f.error(join(owhere, "name"), "Required value: Option.Name must not be empty")
            continue
        options.append(DNSOption(name, get_str(f, o, "value", owhere)
                                 if o.get("value") is not None else None))
    return PodDNSConfig(tuple(servers), tuple(searches), tuple(options))


def parse_pod_dns(f: Findings, m: Mapping[str, Any], path: str, policy_none: bool) -> PodDNS:
    """The spec's DNS fields; ``policy_none``: ``dnsPolicy: None`` (dnsConfig required)."""
    return PodDNS(hostname=_label(f, m, "hostname", path),
                  subdomain=_label(f, m, "subdomain", path),
                  set_hostname_as_fqdn=get_bool(f, m, "setHostnameAsFQDN", path),
                  host_aliases=_aliases(f, m, path),
                  config=_config(f, m, path, policy_none))


def pod_dns_from_wire(s: Mapping[str, Any]) -> PodDNS:
    """The trusted rebuild from ``PodDNS.to_dict`` (wire.py)."""
    c = s.get("dnsConfig")
    config = None if c is None else PodDNSConfig(
        tuple(c.get("nameservers", ())), tuple(c.get("searches", ())),
        tuple(DNSOption(o["name"], o.get("value")) for o in c.get("options", ())))
    return PodDNS(hostname=s.get("hostname", ""), subdomain=s.get("subdomain", ""),
                  set_hostname_as_fqdn=s.get("setHostnameAsFQDN", False),
                  host_aliases=tuple(HostAlias(a["ip"], tuple(a.get("hostnames", ())))
                                     for a in s.get("hostAliases", ())),
                  config=config)
