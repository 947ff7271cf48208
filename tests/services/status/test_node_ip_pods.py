"""``nodeIP`` in the pods (issue 26): with it set, the kubelet reports the node's InternalIPs as
each pod's ``hostIP``/``hostIPs`` (and a hostNetwork pod's ``podIP(s)``), and the downward API
(``status.hostIP(s)`` in env) gives the same; without it, the address the agent serves on, as
before."""

from __future__ import annotations

from podvisor.common.config import Config, config_from_mapping
from podvisor.ipc.maps import DesiredPod
from podvisor.services.pod import Pod, pod_from_dict
from podvisor.services.status.compute import compute_pod_status
from podvisor.services.status.service import host_ips
from podvisor.services.syncloop.node import discover_node_facts

DUAL = "192.0.2.10,2001:db8::10"


def desired(host_network: bool) -> tuple[DesiredPod, Pod]:
    pod = pod_from_dict({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": "p", "namespace": "default", "uid": "u"},
                         "spec": {"hostNetwork": host_network, "containers": [
                             {"name": "c", "image": "host"}]}}).pod
    return DesiredPod(pod=pod.to_dict(), source="file", worker="syncing"), pod


def test_the_pods_host_ips_are_node_ip_when_set() -> None:
    assert config_from_mapping({"nodeIP": DUAL}).node_ips == ("192.0.2.10", "2001:db8::10")
    assert Config().node_ips == ()
    assert host_ips(config_from_mapping({"nodeIP": DUAL})) == ("192.0.2.10", "2001:db8::10")
    assert host_ips(Config(address="10.1.2.3", node_ip="10.9.9.9")) == ("10.9.9.9",)
    assert host_ips(Config(address="10.1.2.3")) == ("10.1.2.3",)  # as before
    assert host_ips(Config()) == ("127.0.0.1",)


def test_status_reports_every_node_ip() -> None:
    ips = ("192.0.2.10", "2001:db8::10")
    entry, pod = desired(host_network=False)
    st = compute_pod_status(entry, pod, None, None, 0.0, host_ips=ips).status
    assert (st.host_ip, st.host_ips, st.pod_ips) == ("192.0.2.10", ips, ())
    entry, pod = desired(host_network=True)
    st = compute_pod_status(entry, pod, None, None, 0.0, host_ips=ips).status
    assert (st.pod_ip, st.pod_ips) == ("192.0.2.10", ips)


def test_the_downward_api_takes_node_ip_too() -> None:
    facts = discover_node_facts("127.0.0.1", "n", ("192.0.2.10", "2001:db8::10"))
    assert facts.host_ips == ("192.0.2.10", "2001:db8::10")
    assert discover_node_facts("127.0.0.1", "n").host_ips == ("127.0.0.1",)  # as before
