"""The Node settings of issue 26 as pure functions: the kubelet's allocatable arithmetic and
quantity formatting, the reported kubeletVersion under the version-skew policy, the Node POSTed
at registration, and the config keys refused at start with the key named."""

from __future__ import annotations

from decimal import Decimal

import pytest

from podvisor.common.allocatable import allocatable, format_quantity, formatted, reservation
from podvisor.common.config import ConfigError, config_from_mapping
from podvisor.common.nodekeys import DEFAULT_EVICTION_HARD
from podvisor.services.node.status import (
    MachineFacts,
    NodeShape,
    RuntimeFacts,
    new_node,
    node_status,
)
from podvisor.services.node.version import NEWEST, OLDEST, SkewRefused, choose

GI = 1 << 30
FACTS = MachineFacts(hostname="h", internal_ip="10.0.0.9", cpus=4, memory_bytes=8 * GI,
                     ephemeral_storage_bytes=100 * GI, machine_id="m", system_uuid="u",
                     boot_id="b", kernel_version="6.1", os_image="Debian", architecture="amd64")


@pytest.mark.parametrize(("value", "fmt", "text"), [
    (Decimal("1.9"), "DecimalSI", "1900m"), (Decimal(2), "DecimalSI", "2"),
    (Decimal(1000), "DecimalSI", "1k"), (Decimal("0.1"), "DecimalSI", "100m"),
    (Decimal(8092 << 20), "BinarySI", "8092Mi"), (Decimal(8 * GI), "BinarySI", "8Gi"),
    (Decimal(5000000000), "BinarySI", "5000000000"), (Decimal(1023), "BinarySI", "1023"),
    (Decimal(0), "BinarySI", "0"), (Decimal(110), "DecimalSI", "110"),
    (Decimal(1536), "BinarySI", "1536"), (Decimal(3 << 10), "BinarySI", "3Ki"),
])
def test_quantities_print_as_the_api_does(value: Decimal, fmt: str, text: str) -> None:
    assert format_quantity(value, fmt) == text  # type: ignore[arg-type]


def test_allocatable_is_capacity_less_reserved_and_hard_eviction() -> None:
    cap = {"cpu": Decimal(4), "memory": Decimal(8 * GI),
           "ephemeral-storage": Decimal(100 * GI), "pods": Decimal(110)}
    left = allocatable(cap, {"cpu": "100m", "memory": "1Gi"}, {"cpu": "500m", "memory": "512Mi"},
                       DEFAULT_EVICTION_HARD)
    assert formatted(left) == {"cpu": "3400m", "memory": "6556Mi",  # 8Gi - 1.5Gi - 100Mi
                               "ephemeral-storage": "96636764000", "pods": "110"}
    # nodefs.available<10%: the kubelet's float32 percentage of the capacity, in whole bytes
    assert reservation(cap, {}, {}, {"nodefs.available": "10%"}) == {
        "ephemeral-storage": Decimal(int(100 * GI * 0.10000000149011612))}
    # more reserved than there is: 0, never negative; pid reserves nothing of the capacity
    assert formatted(allocatable(cap, {"cpu": "5", "pid": "100"}, {}, {}))["cpu"] == "0"


def test_node_status_and_registration_carry_the_settings() -> None:
    shape = NodeShape(node_ips=("10.1.1.1", "fd00::1"), labels={"disk": "ssd"},
                      taints=[{"key": "dedicated", "value": "ci", "effect": "NoSchedule"}],
                      provider_id="podvisor://rack1/h", kube_reserved={"cpu": "1"},
                      system_reserved={}, eviction_hard={"memory.available": "1Gi"})
    status = node_status("n", FACTS, RuntimeFacts("r://1", ""), max_pods=50, port=10250,
                         kubelet_version="v1.33.0+podvisor-0.1.0", shape=shape)
    assert status["addresses"] == [{"type": "InternalIP", "address": "10.1.1.1"},
                                   {"type": "InternalIP", "address": "fd00::1"},
                                   {"type": "Hostname", "address": "n"}]
    assert status["capacity"] == {"cpu": "4", "memory": "8Gi", "ephemeral-storage": "100Gi",
                                  "pods": "50"}
    assert status["allocatable"] == {"cpu": "3", "memory": "7Gi",
                                     "ephemeral-storage": "100Gi", "pods": "50"}
    assert status["nodeInfo"]["kubeletVersion"] == "v1.33.0+podvisor-0.1.0"
    node = new_node("n", FACTS, shape)
    assert node["metadata"]["labels"]["disk"] == "ssd"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "n"
    assert node["spec"] == {"taints": [{"key": "dedicated", "value": "ci",
                                        "effect": "NoSchedule"}],
                            "providerID": "podvisor://rack1/h"}
    plain = node_status("n", FACTS, RuntimeFacts("r://1", ""), max_pods=50, port=1,
                        kubelet_version="v", shape=NodeShape())
    assert plain["addresses"][0] == {"type": "InternalIP", "address": "10.0.0.9"}
    assert "spec" not in new_node("n", FACTS, NodeShape())


@pytest.mark.parametrize(("server", "reported"), [
    ("v1.40.2", f"v1.{NEWEST}.0+podvisor-9.9"),
    (f"v1.{NEWEST}.5-gke.1", f"v1.{NEWEST}.0+podvisor-9.9"),
    (f"v1.{OLDEST + 1}.0", f"v1.{OLDEST + 1}.0+podvisor-9.9"),
    (f"v1.{OLDEST}.3+k3s1", f"v1.{OLDEST}.0+podvisor-9.9"),
])
def test_kubelet_version_never_newer_than_the_api_server(server: str, reported: str) -> None:
    choice = choose({"major": "1", "minor": "x", "gitVersion": server}, own="9.9")
    assert choice.kubelet_version == reported
    assert bool(choice.warning) == (int(server.split(".")[1]) - NEWEST > 3)


def test_an_api_server_older_than_podvisor_implements_is_refused() -> None:
    with pytest.raises(SkewRefused, match="version-skew policy"):
        choose({"gitVersion": f"v1.{OLDEST - 1}.9"}, own="1")
    assert choose({"major": "1", "minor": f"{NEWEST}+"}, own="1").kubelet_version.startswith(
        f"v1.{NEWEST}.0+")


@pytest.mark.parametrize(("config", "key"), [
    ({"nodeLabels": {"kubernetes.io/role": "x"}}, "nodeLabels"),
    ({"nodeLabels": {"a/b/c": "x"}}, "nodeLabels.a/b/c"),
    ({"nodeLabels": "novalue"}, "nodeLabels"),
    ({"registerWithTaints": [{"key": "k", "effect": "Sometimes"}]}, "registerWithTaints[0].effect"),
    ({"registerWithTaints": "k=v"}, "registerWithTaints"),
    ({"registerWithTaints": [{"key": "k", "effect": "NoSchedule", "x": 1}]},
     "registerWithTaints[0].x"),
    ({"kubeReserved": {"gpu": "1"}}, "kubeReserved.gpu"),
    ({"systemReserved": {"memory": "lots"}}, "systemReserved.memory"),
    ({"evictionHard": {"memory.free": "1Gi"}}, "evictionHard.memory.free"),
    ({"evictionHard": {"nodefs.available": "110%"}}, "evictionHard.nodefs.available"),
    ({"nodeIP": "224.0.0.1"}, "nodeIP"), ({"nodeIP": "10.0.0.1,10.0.0.2"}, "nodeIP"),
    ({"nodeIP": "nope"}, "nodeIP"), ({"providerID": 5}, "providerID"),
    ({"bootstrapKubeconfig": "/b"}, "bootstrapKubeconfig"),
    ({"serverTLSBootstrap": True}, "serverTLSBootstrap"),
    ({"rotateCertificates": "maybe"}, "rotateCertificates"),
])
def test_bad_node_settings_are_refused_with_the_key_named(config: dict[str, object],
                                                          key: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_mapping(config)
    assert err.value.key == key, err.value


def test_flag_forms_parse_like_the_kubelets() -> None:
    config = config_from_mapping({
        "kubeconfig": "/k", "nodeLabels": "disk=ssd,node.kubernetes.io/pool=a",
        "registerWithTaints": "dedicated=ci:NoSchedule,spot:PreferNoSchedule",
        "kubeReserved": "cpu=200m,memory=256Mi", "evictionHard": "memory.available<5%",
        "nodeIP": "127.0.0.1"})
    assert config.node_labels == {"disk": "ssd", "node.kubernetes.io/pool": "a"}
    assert list(config.register_with_taints) == [
        {"key": "dedicated", "value": "ci", "effect": "NoSchedule"},
        {"key": "spot", "effect": "PreferNoSchedule"}]
    assert config.kube_reserved == {"cpu": "200m", "memory": "256Mi"}
    assert config.eviction_hard == {"memory.available": "5%"}  # replaces the defaults whole
    assert config_from_mapping({}).eviction_hard == DEFAULT_EVICTION_HARD


def test_a_node_ip_that_is_not_this_hosts_is_refused() -> None:
    from podvisor.services.node.status import node_shape

    with pytest.raises(ValueError, match="not found in the host's network interfaces"):
        node_shape(config_from_mapping({"nodeIP": "192.0.2.1"}))
    shape = node_shape(config_from_mapping({"nodeIP": "127.0.0.1", "nodeLabels": "a=b"}))
    assert shape.node_ips == ("127.0.0.1",) and shape.labels == {"a": "b"}
    assert shape.eviction_hard == DEFAULT_EVICTION_HARD


def test_pressure_conditions_and_taints_follow_the_eviction_manager() -> None:
    """The Node's pressure conditions say what the eviction manager holds True, in the
    kubelet's words; the NoSchedule taints follow them, other taints untouched."""
    from podvisor.services.node.status import pressure_conditions, pressure_taints

    conds = {c["type"]: c for c in pressure_conditions(("MemoryPressure",))}
    assert (conds["MemoryPressure"]["status"], conds["MemoryPressure"]["reason"],
            conds["MemoryPressure"]["message"]) == (
        "True", "KubeletHasInsufficientMemory", "kubelet has insufficient memory available")
    assert (conds["DiskPressure"]["status"], conds["DiskPressure"]["reason"]) == (
        "False", "KubeletHasNoDiskPressure")
    assert conds["PIDPressure"]["reason"] == "KubeletHasSufficientPID"
    mine = {"key": "dedicated", "value": "x", "effect": "NoExecute"}
    tainted = pressure_taints([mine], ("MemoryPressure", "DiskPressure"))
    assert tainted == [mine, {"key": "node.kubernetes.io/disk-pressure", "effect": "NoSchedule"},
                       {"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"}]
    assert pressure_taints(tainted, ()) == [mine]
