"""End to end, on the embedded runtime and on containerd (skipped with the reason when none is
available): a pod's DNS and names as the kubelet gives them. A pod with ``hostname``,
``subdomain``, ``setHostnameAsFQDN``, ``hostAliases`` and ``dnsPolicy: None`` + ``dnsConfig``
sees its FQDN as its hostname, the managed /etc/hosts (its IP with the FQDN, the aliases) and
the resolv.conf of its dnsConfig; a ClusterFirst pod gets the agent's ``clusterDNS`` and the
cluster's search paths; a hostNetwork pod keeps the node's resolver and hostname."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.lifecycle import agent_config, free_port

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a pod's own hostname and mounts "
                                                         "need root")

REPORT = ("{ hostname; echo ---; cat /etc/hosts; echo ---; cat /etc/resolv.conf; } "
          "> /out/r.tmp && mv /out/r.tmp /out/report; exec sleep 3600")


def pods(image: str) -> dict[str, dict[str, Any]]:
    def pod(name: str, **spec: Any) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"terminationGracePeriodSeconds": 1,
                         "volumes": [{"name": "out", "emptyDir": {}}],
                         "containers": [{"name": "c", "image": image,
                                         "command": ["sh", "-c", REPORT],
                                         "volumeMounts": [{"name": "out",
                                                           "mountPath": "/out"}]}],
                         **spec}}

    return {
        "named": pod("named", hostname="db", subdomain="dbs", setHostnameAsFQDN=True,
                     hostAliases=[{"ip": "10.1.2.3", "hostnames": ["foo.local", "bar"]}],
                     dnsPolicy="None",
                     dnsConfig={"nameservers": ["192.0.2.53"], "searches": ["pv.example"],
                                "options": [{"name": "ndots", "value": "2"}]}),
        "cluster": pod("cluster"),
        "hostnet": pod("hostnet", hostNetwork=True),
    }


@pytest.mark.timeout(170)
def test_pod_dns_and_names(pod_runtime: dict[str, Any], agent: Any, wait_for: Any) -> None:
    manifests = Path(tempfile.mkdtemp(prefix="pvdns", dir="/tmp"))
    try:
        for name, doc in pods(pod_runtime["image"]).items():
            (manifests / f"{name}.yaml").write_text(yaml.safe_dump(doc), "utf-8")
        handle = agent(config=agent_config(
            manifests, free_port(), clusterDNS=["10.96.0.10"], clusterDomain="cluster.local",
            **pod_runtime["config"]))
        root = Path(handle.config["rootDir"])

        def report(pod: str) -> list[str] | None:
            for uid_dir in (root / "pods").glob("*"):
                path = uid_dir / "volumes" / "kubernetes.io~empty-dir" / "out" / "report"
                if path.exists() and (uid_dir / "etc-hosts").exists() == (pod != "hostnet"):
                    text = path.read_text()
                    if pod == "named" and "db.dbs" not in text:
                        continue
                    if pod == "cluster" and "cluster-e2e" not in text:
                        continue
                    if pod == "hostnet" and "cluster" in text.split("---")[0]:
                        continue
                    return text.split("---\n")
            return None

        hostname, hosts, resolv = wait_for(lambda: report("named"), 120.0, 0.2, "named")
        assert hostname.strip() == "db.dbs.default.svc.cluster.local"
        assert hosts.startswith("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n")
        assert "\tdb.dbs.default.svc.cluster.local\tdb\n" in hosts, hosts
        assert hosts.endswith("# Entries added by HostAliases.\n10.1.2.3\tfoo.local\n"
                              "10.1.2.3\tbar\n"), hosts
        assert sorted(resolv.splitlines()) == ["nameserver 192.0.2.53", "options ndots:2",
                                               "search pv.example"], resolv  # any order

        hostname, hosts, resolv = wait_for(lambda: report("cluster"), 120.0, 0.2, "cluster")
        assert hostname.strip() == "cluster-e2e"
        lines = resolv.splitlines()
        assert [x for x in lines if x.startswith("nameserver")] == ["nameserver 10.96.0.10"]
        assert [x for x in lines if x.startswith("search default.svc.cluster.local "
                                                 "svc.cluster.local cluster.local")], resolv
        assert "options ndots:5" in lines, resolv

        found = wait_for(lambda: [p for p in (root / "pods").glob(
            "*/volumes/kubernetes.io~empty-dir/out/report")
            if not (p.parents[3] / "etc-hosts").exists()], 120.0, 0.2, "hostnet")
        hostname, hosts, resolv = found[0].read_text().split("---\n")
        assert hostname.strip() == socket.gethostname()
        node = Path("/etc/resolv.conf").read_text()
        assert [x for x in resolv.splitlines() if x.startswith("nameserver")] == [
            x for x in node.splitlines() if x.startswith("nameserver")]
    finally:
        shutil.rmtree(manifests, ignore_errors=True)
