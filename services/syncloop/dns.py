"""A pod's resolv.conf, hostname and /etc/hosts, as the kubelet makes them (pure functions but
``read_resolv_conf``; /etc/hosts is read and the file written by syncpod.py).

- ``pod_dns``: the kubelet's ``GetPodDNS`` (pkg/kubelet/network/dns): the node's resolv.conf
  (``resolvConf``) as the base; ``ClusterFirst`` (not on the host network) and
  ``ClusterFirstWithHostNet`` put ``clusterDNS`` as the only nameservers, the searches
  ``<ns>.svc.<clusterDomain>``, ``svc.<clusterDomain>``, ``<clusterDomain>`` before the node's,
  and ``ndots:5``; without ``clusterDNS`` they fall back to ``Default`` with a
  ``MissingClusterDNS`` warning; ``Default`` is the node's; ``None`` starts empty; then the pod's
  ``dnsConfig`` is appended (duplicates dropped, options merged by name, the pod's winning);
  last the limits (3 nameservers, 32 searches of at most 253 characters, 2048 characters in
  all), each cut with a ``DNSConfigForming`` warning. An empty ``resolvConf`` means
  ``nameserver 127.0.0.1`` and ``search .`` for the node's part, as the kubelet does.
- ``hostname_and_domain``: ``GeneratePodHostNameAndDomain``: ``spec.hostname`` or the pod's
  name (cut to 63 characters, trailing '-' and '.' dropped), and with ``subdomain`` the domain
  ``<subdomain>.<ns>.svc.<clusterDomain>``; ``kernel_hostname`` the sandbox's hostname
  (``GetNodenameForKernel``: the FQDN with ``setHostnameAsFQDN``, at most 64 characters).
- ``hosts_file``: ``ensureHostsFile``: for a pod on the host network the node's /etc/hosts, else
  the managed file (localhost lines, then each pod IP with the FQDN and the hostname), then
  ``hostAliases``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from podvisor.services.pod import DNSPolicy, Pod

DEFAULT_OPTIONS = ("ndots:5",)
MAX_NAMESERVERS, MAX_SEARCHES, MAX_SEARCH_CHARS, MAX_SEARCH_LEN = 3, 32, 2048, 253
MAX_HOSTNAME, MAX_KERNEL_HOSTNAME = 63, 64
MANAGED_HEADER = "# Kubernetes-managed hosts file.\n"
MANAGED_HEADER_HOST_NETWORK = "# Kubernetes-managed hosts file (host network).\n"


@dataclass(frozen=True)
class DnsSettings:
    """The KubeletConfiguration keys: ``clusterDNS``, ``clusterDomain``, ``resolvConf``."""

    cluster_dns: tuple[str, ...] = ()
    cluster_domain: str = ""
    resolv_conf: str = "/etc/resolv.conf"


@dataclass(frozen=True)
class ResolvConf:
    servers: tuple[str, ...] = ()
    searches: tuple[str, ...] = ()
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class PodDnsResult:
    conf: ResolvConf
    # (reason, message) events for the pod, as the kubelet records them
    warnings: tuple[tuple[str, str], ...] = field(default=())


def parse_resolv_conf(text: str) -> ResolvConf:
    """``parseResolvConf``: nameservers accumulate, the last ``search`` and ``options`` win,
    a search's trailing dot is dropped."""
    servers: list[str] = []
    searches: list[str] = []
    options: list[str] = []
    for line in text.splitlines():
        words = line.strip().split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "nameserver" and len(words) >= 2:
            servers.append(words[1])
        elif words[0] == "search":
            searches = [w.removesuffix(".") for w in words[1:]]
        elif words[0] == "options":
            options = words[1:]
    return ResolvConf(tuple(servers), tuple(searches), tuple(options))


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _merge_options(base: tuple[str, ...], pod: list[tuple[str, str | None]]) -> tuple[str, ...]:
    merged: dict[str, str] = {}
    for op in base:
        name, sep, value = op.partition(":")
        merged[name] = value if sep else ""
    for key, given in pod:
        merged[key] = given or ""
    return tuple(f"{k}:{v}" if v else k for k, v in merged.items())


def pod_dns(pod: Pod, settings: DnsSettings, node: ResolvConf | None,
            node_ips: tuple[str, ...] = ()) -> PodDnsResult:
    """``node``: the parsed ``resolvConf`` (None: ``resolvConf`` is "")."""
    warnings: list[tuple[str, str]] = []
    host = node if node is not None else ResolvConf()
    # the node's part; with resolvConf "" the kubelet makes it the local resolver
    conf = host if node is not None else ResolvConf(
        tuple("::1" if ":" in ip else "127.0.0.1" for ip in node_ips) or ("127.0.0.1",), (".",))
    policy = pod.spec.dns_policy
    if policy is DNSPolicy.NONE:
        conf = ResolvConf()
    elif policy is DNSPolicy.CLUSTER_FIRST_WITH_HOST_NET or (
            policy is DNSPolicy.CLUSTER_FIRST and not pod.spec.host_network):
        if settings.cluster_dns:
            searches = list(host.searches)
            if settings.cluster_domain:
                d, ns = settings.cluster_domain, pod.namespace
                searches = _unique([f"{ns}.svc.{d}", f"svc.{d}", d, *searches])
            conf = ResolvConf(settings.cluster_dns, tuple(searches), DEFAULT_OPTIONS)
        else:
            warnings.append(("MissingClusterDNS", (
                f'pod: "{pod.full_name}({pod.uid})". kubelet does not have ClusterDNS IP '
                f'configured and cannot create Pod using "{policy}" policy. Falling back to '
                '"Default" policy.')))
    extra = pod.spec.dns.config
    if extra is not None:
        conf = ResolvConf(tuple(_unique([*conf.servers, *extra.nameservers])),
                          tuple(_unique([*conf.searches, *extra.searches])),
                          _merge_options(conf.options, [(o.name, o.value)
                                                        for o in extra.options]))
    return PodDnsResult(*_fit(conf, warnings))


def _fit(conf: ResolvConf, warnings: list[tuple[str, str]]
         ) -> tuple[ResolvConf, tuple[tuple[str, str], ...]]:
    """``formDNSConfigFitsLimits``."""
    servers = list(conf.servers)
    if len(servers) > MAX_NAMESERVERS:
        servers = servers[:MAX_NAMESERVERS]
        warnings.append(("DNSConfigForming", "Nameserver limits were exceeded, some nameservers "
                         f"have been omitted, the applied nameserver line is: "
                         f"{' '.join(servers)}"))
    searches = list(conf.searches)
    exceeded = len(searches) > MAX_SEARCHES
    searches = searches[:MAX_SEARCHES]
    kept = [s for s in searches if len(s) <= MAX_SEARCH_LEN]
    exceeded = exceeded or len(kept) < len(searches)
    length = 0
    for i, search in enumerate(kept):  # the longest head that fits (the kubelet cuts the tail)
        length += len(search) + (1 if i else 0)
        if length > MAX_SEARCH_CHARS:
            kept, exceeded = kept[:i], True
            break
    if exceeded:
        warnings.append(("DNSConfigForming", "Search Line limits were exceeded, some search "
                         "paths have been omitted, the applied search line is: "
                         f"{' '.join(kept)}"))
    return ResolvConf(tuple(servers), tuple(kept), conf.options), tuple(warnings)


def resolv_conf_text(conf: ResolvConf) -> str:
    """The file a runtime writes for the config (containerd's ``parseDNSOptions``)."""
    lines = [f"nameserver {s}" for s in conf.servers]
    lines += [f"search {' '.join(conf.searches)}"] if conf.searches else []
    lines += [f"options {' '.join(conf.options)}"] if conf.options else []
    return "\n".join(lines) + "\n" if lines else ""


def hostname_and_domain(pod: Pod, cluster_domain: str) -> tuple[str, str]:
    """``GeneratePodHostNameAndDomain`` (hostname and subdomain are validated labels)."""
    hostname = pod.spec.dns.hostname or pod.name
    if len(hostname) > MAX_HOSTNAME:
        hostname = hostname[:MAX_HOSTNAME].rstrip("-.")
    domain = ""
    if pod.spec.dns.subdomain:
        domain = f"{pod.spec.dns.subdomain}.{pod.namespace}.svc.{cluster_domain}"
    return hostname, domain


def kernel_hostname(pod: Pod, cluster_domain: str) -> str:
    """The sandbox's hostname (``GetNodenameForKernel``); ValueError (the kubelet's message)
    when the FQDN asked for is longer than the kernel's 64."""
    hostname, domain = hostname_and_domain(pod, cluster_domain)
    if not (pod.spec.dns.set_hostname_as_fqdn and domain):
        return hostname
    fqdn = f"{hostname}.{domain}"
    if len(fqdn) > MAX_KERNEL_HOSTNAME:
        raise ValueError(f"failed to construct FQDN from pod hostname and cluster domain, FQDN "
                         f"{fqdn} is too long ({MAX_KERNEL_HOSTNAME} characters is the max, "
                         f"{len(fqdn)} characters requested)")
    return fqdn


def hosts_file(pod: Pod, pod_ips: tuple[str, ...], cluster_domain: str,
               node_hosts: str) -> str:
    """``ensureHostsFile``'s content (``node_hosts``: the node's /etc/hosts)."""
    if pod.spec.host_network:
        out = MANAGED_HEADER_HOST_NETWORK + node_hosts
    else:
        hostname, domain = hostname_and_domain(pod, cluster_domain)
        out = (MANAGED_HEADER + "127.0.0.1\tlocalhost\n"
               "::1\tlocalhost ip6-localhost ip6-loopback\n"
               "fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\n"
               "fe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n")
        for ip in pod_ips:
            out += f"{ip}\t{hostname}.{domain}\t{hostname}\n" if domain else \
                f"{ip}\t{hostname}\n"
    if pod.spec.dns.host_aliases:
        out += "\n# Entries added by HostAliases.\n"
        for alias in pod.spec.dns.host_aliases:
            out += "".join(f"{alias.ip}\t{name}\n" for name in alias.hostnames)
    return out


def read_resolv_conf(path: str) -> ResolvConf | None:
    """The node's ``resolvConf`` (None for ""); ValueError when it cannot be read (the
    kubelet then fails the pod's sandbox)."""
    if not path:
        return None
    try:
        with open(path, errors="replace") as f:
            return parse_resolv_conf(f.read(10 << 20))
    except OSError as err:
        raise ValueError(f"failed to read resolvConf {path!r}: {err.strerror}") from None
