"""syncloop/dns.py: the kubelet's GetPodDNS, GeneratePodHostNameAndDomain,
GetNodenameForKernel and ensureHostsFile, as pure functions; and the sandbox config the sync
loop sends with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from podvisor.services.pod import Pod, pod_from_dict
from podvisor.services.syncloop import cri_config
from podvisor.services.syncloop.dns import (
    DnsSettings,
    ResolvConf,
    hosts_file,
    kernel_hostname,
    parse_resolv_conf,
    pod_dns,
    resolv_conf_text,
)

NODE = parse_resolv_conf("# node\nnameserver 10.0.0.2\nnameserver 10.0.0.3\n"
                         "search corp.example. lab\noptions timeout:2 rotate\n")
CLUSTER = DnsSettings(("10.96.0.10",), "cluster.local")


def pod(**spec: Any) -> Pod:
    doc: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": "web-0", "namespace": "shop"},
                           "spec": {"containers": [{"name": "c", "image": "host"}], **spec}}
    return pod_from_dict(doc).pod


def test_resolv_conf_parsing() -> None:
    assert ResolvConf(("10.0.0.2", "10.0.0.3"), ("corp.example", "lab"),
                              ("timeout:2", "rotate")) == NODE


def test_cluster_first() -> None:
    got = pod_dns(pod(), CLUSTER, NODE)
    assert got.conf == ResolvConf(("10.96.0.10",), ("shop.svc.cluster.local",
                                                    "svc.cluster.local", "cluster.local",
                                                    "corp.example", "lab"), ("ndots:5",))
    assert got.warnings == ()
    assert resolv_conf_text(got.conf).splitlines()[-1] == "options ndots:5"


def test_host_network_and_default_get_the_nodes() -> None:
    assert pod_dns(pod(hostNetwork=True), CLUSTER, NODE).conf == NODE
    assert pod_dns(pod(dnsPolicy="Default"), CLUSTER, NODE).conf == NODE
    with_host = pod_dns(pod(hostNetwork=True, dnsPolicy="ClusterFirstWithHostNet"), CLUSTER,
                        NODE)
    assert with_host.conf.servers == ("10.96.0.10",)


def test_no_cluster_dns_falls_back_with_a_warning() -> None:
    got = pod_dns(pod(), DnsSettings(), NODE)
    assert got.conf == NODE
    assert got.warnings[0][0] == "MissingClusterDNS"
    assert 'cannot create Pod using "ClusterFirst" policy' in got.warnings[0][1]


def test_none_and_dns_config() -> None:
    config = {"nameservers": ["1.1.1.1", "10.0.0.2"], "searches": ["a.example", "lab"],
              "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"},
                          {"name": "timeout", "value": "5"}]}
    assert pod_dns(pod(dnsPolicy="None", dnsConfig=config), CLUSTER, NODE).conf == ResolvConf(
        ("1.1.1.1", "10.0.0.2"), ("a.example", "lab"), ("ndots:2", "edns0", "timeout:5"))
    merged = pod_dns(pod(dnsPolicy="Default", dnsConfig=config), CLUSTER, NODE).conf
    assert merged == ResolvConf(("10.0.0.2", "10.0.0.3", "1.1.1.1"),
                                ("corp.example", "lab", "a.example"),
                                ("timeout:5", "rotate", "ndots:2", "edns0"))


def test_limits_cut_with_warnings() -> None:
    config = {"nameservers": ["1.1.1.1", "1.0.0.1"], "searches": [f"s{i}.example"
                                                                for i in range(31)]}
    got = pod_dns(pod(dnsPolicy="Default", dnsConfig=config), CLUSTER, NODE)
    assert got.conf.servers == ("10.0.0.2", "10.0.0.3", "1.1.1.1")
    assert len(got.conf.searches) == 32
    assert [r for r, _ in got.warnings] == ["DNSConfigForming", "DNSConfigForming"]


def test_empty_resolv_conf_is_the_local_resolver() -> None:
    assert pod_dns(pod(dnsPolicy="Default"), CLUSTER, None, ("192.0.2.1", "2001:db8::1")
                   ).conf == ResolvConf(("127.0.0.1", "::1"), (".",))


def test_hostnames() -> None:
    assert kernel_hostname(pod(), "cluster.local") == "web-0"
    assert kernel_hostname(pod(hostname="db", subdomain="dbs"), "cluster.local") == "db"
    fqdn = pod(hostname="db", subdomain="dbs", setHostnameAsFQDN=True)
    assert kernel_hostname(fqdn, "cluster.local") == "db.dbs.shop.svc.cluster.local"
    long = pod(hostname="h" * 40, subdomain="s" * 20, setHostnameAsFQDN=True)
    with pytest.raises(ValueError, match=r"FQDN .* is too long"):
        kernel_hostname(long, "cluster.local")
    config = cri_config.sandbox_config(fqdn, 0, Path("/logs"), "", "db.example",
                                       None)
    assert config.hostname == "db.example"
    assert cri_config.sandbox_config(pod(hostNetwork=True), 0, Path("/l"), "", "x"
                                     ).hostname == ""


def test_hosts_file() -> None:
    aliases = [{"ip": "10.1.2.3", "hostnames": ["foo.local", "bar"]}]
    p = pod(hostname="db", subdomain="dbs", hostAliases=aliases)
    text = hosts_file(p, ("10.200.0.5",), "cluster.local", "")
    assert text.startswith("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n")
    assert "10.200.0.5\tdb.dbs.shop.svc.cluster.local\tdb\n" in text
    assert text.endswith("\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\n"
                         "10.1.2.3\tbar\n")
    host = hosts_file(pod(hostNetwork=True, hostAliases=aliases), ("192.0.2.1",), "",
                      "127.0.0.1 localhost\n")
    assert host.startswith("# Kubernetes-managed hosts file (host network).\n"
                           "127.0.0.1 localhost\n\n# Entries added by HostAliases.\n")


def test_the_search_line_is_cut_to_2048_characters() -> None:
    """The cluster's 3 and the node's 2 search paths, then the pod's 8 of 251 characters: the
    tail that does not fit in 2048 characters is cut (valid alone, too long together)."""
    long = [".".join([c * 60] * 4) + ".example" for c in "abcdefgh"]
    got = pod_dns(pod(dnsConfig={"searches": long}), CLUSTER, NODE)
    assert got.conf.searches[:5] == ("shop.svc.cluster.local", "svc.cluster.local",
                                     "cluster.local", "corp.example", "lab")
    assert got.conf.searches[5:] == tuple(long[:7])
    assert len(" ".join(got.conf.searches)) <= 2048
    assert got.warnings[0][0] == "DNSConfigForming"
