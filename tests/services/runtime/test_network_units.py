"""The pod network's pure parts (issue 27 part 3): the CNI results and config podvisor reads and
writes, the attachment's round trip, the monitor request's NETNS section, the config keys, and
what the Node's Ready condition says in host network mode. No plugin runs here
(tests/services/runtime/test_embedded_network.py runs them)."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from podvisor.common.config import Config, ConfigError, cni_conf_dir, config_from_mapping
from podvisor.services.node.status import RuntimeFacts, node_status
from podvisor.services.runtime.cni import (
    POOL,
    Attachment,
    Cni,
    PortMapping,
    bridge_of,
    default_conflist,
    ips_of,
)
from podvisor.services.runtime.zygote import Spawner
from tests.services.node.test_node_settings import FACTS


def test_result_ips_ipv4_first() -> None:
    result = {"cniVersion": "1.0.0", "ips": [{"address": "fd00::5/64"},
                                             {"address": "10.208.1.5/24", "gateway": "x"}]}
    assert ips_of(result) == ["10.208.1.5", "fd00::5"]
    assert ips_of({}) == []


def test_default_conflist_is_a_free_bridge_network(tmp_path: Path) -> None:
    conf = default_conflist(tmp_path)
    bridge, gateway, prefix = bridge_of(conf) or ("", "", "")
    subnet = ipaddress.ip_network(conf["plugins"][0]["ipam"]["ranges"][0][0]["subnet"])
    assert subnet.subnet_of(POOL) and prefix == "24"  # type: ignore[arg-type]
    assert gateway == str(subnet.network_address + 1)
    assert bridge.startswith("pv") and len(bridge) <= 15  # an interface name
    assert [p["type"] for p in conf["plugins"]] == ["bridge", "portmap"]
    assert conf["plugins"][0]["isGateway"] is False and conf["plugins"][0]["ipMasq"] is False
    assert conf["plugins"][0]["ipam"]["dataDir"] == str(tmp_path / "network" / "ipam")
    assert bridge_of({"plugins": [{"type": "ptp"}]}) is None


def test_written_once_and_kept(tmp_path: Path) -> None:
    cni = Cni(tmp_path / "rt", tmp_path / "net.d", "/nowhere")
    first = cni.conflist()
    assert json.loads((tmp_path / "net.d" / "10-podvisor.conflist").read_text()) == first
    again = Cni(tmp_path / "rt", tmp_path / "net.d", "/nowhere").conflist()
    assert again == first
    # a plugin that is not there makes the network not ready, with the reason
    assert "'loopback' not found in /nowhere" in cni.problem() or "root" in cni.problem()


def test_an_operators_conflist_wins(tmp_path: Path) -> None:
    (tmp_path / "net.d").mkdir()
    (tmp_path / "net.d" / "05-mine.conf").write_text(json.dumps(
        {"cniVersion": "0.4.0", "name": "mine", "type": "ptp"}))
    conf = Cni(tmp_path / "rt", tmp_path / "net.d", "/usr/lib/cni").conflist()
    assert conf["name"] == "mine" and conf["plugins"] == [
        {"cniVersion": "0.4.0", "name": "mine", "type": "ptp"}]
    assert not (tmp_path / "net.d" / "10-podvisor.conflist").exists()


def test_attachment_round_trip() -> None:
    att = Attachment("s" * 64, "/x/netns/s", "p", "ns", "u",
                     (PortMapping(18080, 8080, "tcp", "127.0.0.1"),),
                     {"ips": [{"address": "10.0.0.2/24"}]}, {"name": "n", "plugins": []})
    assert Attachment.from_json(att.to_json()) == att
    assert att.cni_args() == ("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;"
                              f"K8S_POD_INFRA_CONTAINER_ID={'s' * 64};K8S_POD_UID=u")
    assert att.ports[0].runtime_config() == {"hostPort": 18080, "containerPort": 8080,
                                             "protocol": "tcp", "hostIP": "127.0.0.1"}


def test_monitor_request_names_the_netns() -> None:
    spawner = Spawner()
    spawner._native = True  # the C monitor's NUL-separated request
    spec = json.dumps({"argv": ["sleep", "1"], "env": [], "cwd": "/", "log_path": "",
                       "netns": "/r/netns/abc"}).encode()
    fields = spawner._request("/r/containers/c", spec).split(b"\0")
    at = fields.index(b"NETNS")
    assert fields[at + 1] == b"/r/netns/abc"
    assert fields[at - 1] == b"0"  # after the (empty) mounts count, as a keyed section


def test_config_keys() -> None:
    assert Config().network_plugin == "host"
    c = config_from_mapping({"networkPlugin": "cni", "cniConfDir": "/etc/cni/net.d",
                             "cniBinDir": "/usr/lib/cni", "rootDir": "/r"})
    assert (c.network_plugin, c.cni_bin_dir, str(cni_conf_dir(c))) == (
        "cni", "/usr/lib/cni", "/etc/cni/net.d")
    assert str(cni_conf_dir(config_from_mapping({"rootDir": "/r"}))) == "/r/cni/net.d"
    with pytest.raises(ConfigError, match="networkPlugin"):
        config_from_mapping({"networkPlugin": "flannel"})


def test_node_ready_says_host_network_mode() -> None:
    facts = RuntimeFacts("podvisor://0.1", "", "host network mode: networkPlugin: host")
    ready = [c for c in node_status("n", FACTS, facts, max_pods=10, port=1,
                                    kubelet_version="v")["conditions"] if c["type"] == "Ready"]
    assert ready == [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                      "message": "kubelet is posting ready status. host network mode: "
                                 "networkPlugin: host"}]
    plain = node_status("n", FACTS, RuntimeFacts("r://1", ""), max_pods=10, port=1,
                        kubelet_version="v")["conditions"][-1]
    assert plain["message"] == "kubelet is posting ready status"
