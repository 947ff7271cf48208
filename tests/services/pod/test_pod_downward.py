"""Downward API (validation as the API server, values as the kubelet), $(VAR) expansion,
QoS class and OOM score adjustment, the atomic writer, the runtime's oom_score_adj clamp."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri.fake import FakeRuntimeClient
from podvisor.services.pod import PodValidationError, VolumeMount, pod_from_dict
from podvisor.services.pod.downward import NodeFacts, format_map, go_quote
from podvisor.services.pod.envvars import container_env, expand, expand_command
from podvisor.services.pod.qos import QOSClass, oom_score_adj, qos_class
from podvisor.services.runtime import oom
from podvisor.services.syncloop import cri_config
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.atomic_writer import DATA_LINK, write_atomic
from podvisor.services.syncloop.cri_config import downward_api_path
from podvisor.services.syncloop.node import discover_node_facts, host_ips, memory_total
from podvisor.services.syncloop.volumes import setup_volumes
from tests.services.syncloop.test_podworkers import Harness, manifest

NODE = NodeFacts(cpu_millis=2000, memory_bytes=8 * 2**30, host_ips=("10.0.0.5",))
GiB = 2**30


def pod(env: list[dict[str, Any]] | None = None, resources: dict[str, Any] | None = None,
        **spec: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "c", "image": "host", "command": ["sh"], "env": env or []}
    if resources is not None:
        c["resources"] = resources
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-1",
                         "labels": {"app": "web", "tier": "a.b"},
                         "annotations": {"note": "x\ny"}},
            "spec": {"containers": [c], "nodeName": "node1", **spec}}


def field(path: str) -> dict[str, Any]:
    return {"name": "V", "valueFrom": {"fieldRef": {"fieldPath": path}}}


def resource(res: str, divisor: str | None = None, container: str = "") -> dict[str, Any]:
    ref: dict[str, Any] = {"resource": res}
    if divisor is not None:
        ref["divisor"] = divisor
    if container:
        ref["containerName"] = container
    return {"name": "V", "valueFrom": {"resourceFieldRef": ref}}


def env_of(doc: dict[str, Any], pod_ips: tuple[str, ...] = ("10.1.0.7",)) -> dict[str, str]:
    p = pod_from_dict(doc).pod
    return dict(container_env(p, p.spec.containers[0], NODE, pod_ips))


@pytest.mark.parametrize("path,value", [
    ("metadata.name", "p"),
    ("metadata.namespace", "ns"),
    ("metadata.uid", "u-1"),
    ("metadata.labels['app']", "web"),
    ("metadata.labels['missing']", ""),
    ("metadata.annotations['note']", "x\ny"),
    ("spec.nodeName", "node1"),
    ("spec.serviceAccountName", ""),
    ("status.hostIP", "10.0.0.5"),
    ("status.hostIPs", "10.0.0.5"),
    ("status.podIP", "10.1.0.7"),
    ("status.podIPs", "10.1.0.7"),
])
def test_field_ref_values(path: str, value: str) -> None:
    assert env_of(pod([field(path)]))["V"] == value


def test_service_account_name_value() -> None:
    assert env_of(pod([field("spec.serviceAccountName")], serviceAccountName="default"))[
        "V"] == "default"


@pytest.mark.parametrize("env,value", [
    (resource("limits.cpu"), "1"),                       # 500m rounded up to whole cores
    (resource("limits.cpu", "1m"), "500"),
    (resource("requests.cpu", "1m"), "250"),
    (resource("limits.memory"), str(128 * 2**20)),
    (resource("limits.memory", "1Mi"), "128"),
    (resource("requests.memory", "1Mi"), "128"),         # requests default to limits
    (resource("limits.memory", "1Gi"), "1"),             # ceil
    (resource("limits.cpu", container="other"), "2"),    # no limit: node allocatable (2 CPUs)
    (resource("limits.memory", "1Gi", "other"), "8"),
    (resource("requests.cpu", container="other"), "0"),
])
def test_resource_field_ref_values(env: dict[str, Any], value: str) -> None:
    doc = pod([env], {"limits": {"cpu": "500m", "memory": "128Mi"},
                      "requests": {"cpu": "250m"}})
    doc["spec"]["containers"].append({"name": "other", "image": "host", "command": ["sh"]})
    assert env_of(doc)["V"] == value


STORAGE_NODE = replace(NODE, ephemeral_storage_bytes=50 * 2**30)


@pytest.mark.parametrize("env,value", [
    (resource("limits.ephemeral-storage"), str(2 * 2**30)),
    (resource("limits.ephemeral-storage", "1Mi"), "2048"),
    (resource("requests.ephemeral-storage", "1Gi"), "1"),
    (resource("requests.ephemeral-storage", "1G"), "2"),       # ceil(1Gi / 1G)
    (resource("limits.hugepages-2Mi", "1Mi"), "4"),
    (resource("requests.hugepages-2Mi"), str(4 * 2**20)),     # requests default to limits
    (resource("limits.hugepages-1Gi"), "0"),                  # not set: 0 (no node default)
    # no limit: the node's allocatable ephemeral-storage (MergeContainerResourceLimits)
    (resource("limits.ephemeral-storage", "1Gi", "other"), "50"),
    (resource("requests.ephemeral-storage", container="other"), "0"),
    (resource("limits.hugepages-2Mi", container="other"), "0"),
])
def test_resource_field_ref_storage_and_hugepages(env: dict[str, Any], value: str) -> None:
    """``resourceFieldRef`` of ``ephemeral-storage`` and ``hugepages-<size>`` (issue 24), as
    ``ExtractContainerResourceValue``: ceil(amount / divisor); an unset ephemeral-storage
    limit is the node's allocatable, an unset hugepages one 0 (hugepages are never
    defaulted)."""
    doc = pod([env], {"limits": {"ephemeral-storage": "2Gi", "hugepages-2Mi": "4Mi",
                                 "memory": "64Mi"},
                      "requests": {"ephemeral-storage": "1Gi"}})
    doc["spec"]["containers"].append({"name": "other", "image": "host", "command": ["sh"]})
    p = pod_from_dict(doc).pod
    c = p.spec.containers[0]
    assert dict(container_env(p, c, STORAGE_NODE, ("10.1.0.7",)))["V"] == value


def test_resource_field_ref_storage_in_a_volume(tmp_path: Path) -> None:
    """A downwardAPI volume's ``resourceFieldRef`` file of ``limits.ephemeral-storage`` and
    ``requests.hugepages-2Mi``."""
    doc = volume([{"path": "disk", "resourceFieldRef": {
                       "containerName": "c", "resource": "limits.ephemeral-storage",
                       "divisor": "1Mi"}},
                  {"path": "pages", "resourceFieldRef": {
                      "containerName": "c", "resource": "requests.hugepages-2Mi"}}])
    doc["spec"]["containers"][0]["resources"] = {
        "limits": {"ephemeral-storage": "512Mi", "hugepages-2Mi": "2Mi", "memory": "64Mi"}}
    p = pod_from_dict(doc).pod
    from podvisor.services.pod.downward import volume_files
    vol = p.spec.volumes[0].source
    files = volume_files(p, vol.items, vol.default_mode, STORAGE_NODE)  # type: ignore[union-attr]
    assert files["disk"][0] == b"512" and files["pages"][0] == str(2 * 2**20).encode()


def test_volume_labels_and_annotations_format() -> None:
    assert format_map({"b": "2", "a": 'x"y'}) == 'a="x\\"y"\nb="2"'
    assert go_quote("tab\there\x00é") == '"tab\\there\\x00é"'


@pytest.mark.parametrize("env,error", [
    (field("metadata.labels"), 'Unsupported value: "metadata.labels": supported values: '
                               '"metadata.name", "metadata.namespace"'),
    (field("status.phase"), 'Unsupported value: "status.phase"'),
    (field("spec.bogus"), 'Invalid value: "spec.bogus": error converting fieldPath: field '
                          "label not supported: spec.bogus"),
    (field("spec.nodeName['x']"), "field label does not support subscript"),
    ({"name": "V", "valueFrom": {"fieldRef": {"fieldPath": ""}}},
     "fieldRef.fieldPath: Required value"),
    ({"name": "V", "valueFrom": {"fieldRef": {"apiVersion": "v2", "fieldPath": "metadata.name"}}},
     "unsupported pod version: v2"),
    (resource("limits.gpu"), 'Unsupported value: "limits.gpu": supported values:'),
    (resource("limits.cpu", "2"), "only divisor's values 1m and 1 are supported with the cpu"),
    (resource("limits.memory", "3Mi"), "only divisor's values 1, 1k, 1M"),
    (resource("limits.ephemeral-storage", "3Mi"),
     "only divisor's values 1, 1k, 1M, 1G, 1T, 1P, 1E, 1Ki, 1Mi, 1Gi, 1Ti, 1Pi, 1Ei are "
     "supported with the local ephemeral storage resource"),
    (resource("requests.hugepages-2Mi", "1m"), "are supported with the hugepages resource"),
    (resource("limits.hugepage-2Mi"), 'Unsupported value: "limits.hugepage-2Mi"'),
    (resource("limits.cpu", container="nope"), 'Invalid value: "nope": no container'),
    ({"name": "V", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
     "may not be specified when `value` is not empty"),
    ({"name": "V", "valueFrom": {}}, "must specify one of: `fieldRef`, `resourceFieldRef`"),
    ({"name": "V", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
     "static pods may not reference API objects (Secret) (only pods from the API server may)"),
])
def test_env_validation_errors(env: dict[str, Any], error: str) -> None:
    with pytest.raises(PodValidationError) as info:
        pod_from_dict(pod([env]))
    assert error in str(info.value), str(info.value)


def volume(items: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return pod(volumes=[{"name": "info", "downwardAPI": {"items": items, **extra}}])


@pytest.mark.parametrize("doc,error", [
    (volume([{"path": "x", "fieldRef": {"fieldPath": "spec.nodeName"}}]),
     'Unsupported value: "spec.nodeName"'),
    (volume([{"path": "../x", "fieldRef": {"fieldPath": "metadata.name"}}]),
     "must be a relative path without '..'"),
    (volume([{"path": "x", "mode": 0o1000, "fieldRef": {"fieldPath": "metadata.name"}}]),
     "must be a number between 0 and 0777"),
    (volume([{"path": "x", "resourceFieldRef": {"resource": "limits.cpu"}}]),
     "resourceFieldRef.containerName: Required value"),
    (volume([{"path": "x", "fieldRef": {"fieldPath": "metadata.name"},
              "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu"}}]),
     "can not be specified simultaneously"),
])
def test_volume_validation_errors(doc: dict[str, Any], error: str) -> None:
    with pytest.raises(PodValidationError) as info:
        pod_from_dict(doc)
    assert error in str(info.value), str(info.value)


def test_volume_round_trips_with_default_mode() -> None:
    doc = volume([{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                  {"path": "cpu", "mode": 0o600,
                   "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu"}}])
    p = pod_from_dict(doc).pod
    wire = p.to_dict()["spec"]["volumes"][0]["downwardAPI"]
    assert wire["defaultMode"] == 0o644 and wire["items"][1]["mode"] == 0o600
    assert pod_from_dict(p.to_dict()).pod == p


@pytest.mark.parametrize("text,expected", [
    ("$(A)", "1"), ("x$(A)y$(B)", "x1y2"), ("$(MISSING)", "$(MISSING)"), ("$$(A)", "$(A)"),
    ("$$", "$"), ("$", "$"), ("a$b", "a$b"), ("$(A", "$(A"), ("$()", "$()"),
    ("$$$(A)", "$1"), ("€$(A)", "€1"),
])
def test_expansion_rules(text: str, expected: str) -> None:
    assert expand(text, {"A": "1", "B": "2"}.get) == expected


def test_env_and_command_expansion_order() -> None:
    doc = pod([field("metadata.name"), {"name": "W", "value": "$(V)-$(LATER)"},
               {"name": "LATER", "value": "z"}, {"name": "F", "value": "$(V)"}])
    doc["spec"]["containers"][0].update(command=["echo", "$(W)", "$(LATER)"], args=["$$(V)"])
    env = env_of(doc)
    assert env == {"V": "p", "W": "p-$(LATER)", "LATER": "z", "F": "p"}
    p = pod_from_dict(doc).pod
    assert expand_command(p.spec.containers[0], env) == (["echo", "p-$(LATER)", "z"], ["$(V)"])


def res(cpu: str | None = None, mem: str | None = None, req_cpu: str | None = None,
        req_mem: str | None = None) -> dict[str, Any]:
    limits = {k: v for k, v in (("cpu", cpu), ("memory", mem)) if v}
    requests = {k: v for k, v in (("cpu", req_cpu), ("memory", req_mem)) if v}
    return {"limits": limits, "requests": requests}


@pytest.mark.parametrize("main,init,expected", [
    (None, None, QOSClass.BEST_EFFORT),
    (res("1", "1Gi"), None, QOSClass.GUARANTEED),          # requests default to limits
    (res("1", "1Gi", "500m"), None, QOSClass.BURSTABLE),
    (res(mem="1Gi"), None, QOSClass.BURSTABLE),
    (res(req_cpu="100m"), None, QOSClass.BURSTABLE),
    (res("1", "1Gi"), res("1", "1Gi"), QOSClass.GUARANTEED),
    (res("1", "1Gi"), {}, QOSClass.BURSTABLE),              # an init container without limits
    (None, res(req_mem="1Mi"), QOSClass.BURSTABLE),
    (res("0", "0"), None, QOSClass.BEST_EFFORT),            # zero counts as unset
])
def test_qos_class(main: Any, init: Any, expected: QOSClass) -> None:
    doc = pod(resources=main)
    if init is not None:
        doc["spec"]["initContainers"] = [{"name": "i", "image": "host", "command": ["sh"],
                                          "resources": init}]
    assert qos_class(pod_from_dict(doc).pod) is expected


@pytest.mark.parametrize("resources,expected", [
    (None, 1000),                                   # BestEffort
    (res("1", "1Gi"), -997),                        # Guaranteed
    (res(req_mem=str(GiB)), 1000 - 1000 * GiB // (8 * GiB)),   # 875
    (res(req_cpu="1"), 999),                        # Burstable, no memory request
    (res(req_mem=str(8 * GiB)), 3),                 # floor 1000 + (-997)
    (res(req_mem="1"), 999),
])
def test_oom_score_adj(resources: Any, expected: int) -> None:
    p = pod_from_dict(pod(resources=resources)).pod
    assert oom_score_adj(p, p.spec.containers[0], NODE.memory_bytes) == expected


def test_runtime_clamps_like_restrict_oom_score_adj() -> None:
    status = "Name:\tx\nCapEff:\t000001fffeffffff\n"      # no CAP_SYS_RESOURCE (bit 24)
    assert not oom.can_lower(status) and oom.can_lower("CapEff:\t000001ffffffffff\n")
    assert oom.effective(-997, 0, lowering_allowed=False) == 0
    assert oom.effective(-997, 0, lowering_allowed=True) == -997
    assert oom.effective(875, 0, lowering_allowed=False) == 875
    assert oom.effective(500, 900, lowering_allowed=False) == 900
    assert oom.effective(5000, 0, lowering_allowed=True) == 1000


def test_runtime_reads_its_own_state_and_cannot_lower_here() -> None:
    current, lowering = oom.own_state()
    assert -1000 <= current <= 1000
    if not lowering:
        with pytest.raises(PermissionError):
            oom.apply(os.getpid(), current - 1)


def test_atomic_writer(tmp_path: Path) -> None:
    target = tmp_path / "vol"
    assert write_atomic(target, {"name": (b"p", 0o644), "d/x": (b"1", 0o600)}, 0.0)
    first = os.readlink(target / DATA_LINK)
    assert first.startswith("..1970_01_01_00_00_00.")
    assert (target / "name").read_text() == "p" and (target / "d" / "x").read_text() == "1"
    assert os.readlink(target / "name") == "..data/name"
    assert (target / "d" / "x").stat().st_mode & 0o777 == 0o600
    assert not write_atomic(target, {"name": (b"p", 0o644), "d/x": (b"1", 0o600)}, 1.0)
    assert write_atomic(target, {"name": (b"q", 0o644)}, 2.0)
    assert os.readlink(target / DATA_LINK) != first and not (target / first).exists()
    now_dir = os.readlink(target / DATA_LINK)
    assert sorted(os.listdir(target)) == sorted(["name", DATA_LINK, now_dir])
    assert (target / "name").read_text() == "q"
    with pytest.raises(ValueError):
        write_atomic(target, {"../evil": (b"", 0o644)}, 3.0)


def test_setup_volumes_writes_the_downward_api_files(tmp_path: Path) -> None:
    doc = volume([{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                  {"path": "meta/note", "fieldRef": {"fieldPath": "metadata.annotations['note']"}},
                  {"path": "cpu", "mode": 0o600, "resourceFieldRef": {
                      "containerName": "c", "resource": "limits.cpu", "divisor": "1m"}}])
    p = pod_from_dict(doc).pod
    assert setup_volumes(p, tmp_path, NODE, 0.0) == {}
    d = downward_api_path(tmp_path, "u-1", "info")
    assert (d / "labels").read_text() == 'app="web"\ntier="a.b"'
    assert (d / "meta" / "note").read_text() == "x\ny"
    assert (d / "cpu").read_text() == "2000"                  # no limit: node allocatable
    assert (d / "cpu").stat().st_mode & 0o777 == 0o600
    assert (d / "labels").stat().st_mode & 0o777 == 0o644
    mounts = cri_config.container_config(
        p, replace(p.spec.containers[0], volume_mounts=(VolumeMount("info", "/etc/info"),)), 0,
        cri_config.volume_paths(p, tmp_path)).mounts
    assert [(m.host_path, m.readonly) for m in mounts] == [(str(d), True)]


def test_node_facts_from_the_machine() -> None:
    assert memory_total("MemTotal:       24683656 kB\nMemFree: 1 kB\n") == 24683656 * 1024
    assert memory_total("nothing") == 0
    assert host_ips("10.1.2.3", "n") == ("10.1.2.3",)          # the configured address
    assert host_ips("127.0.0.1", "n") == ("127.0.0.1",)        # what status reports then
    found = host_ips("0.0.0.0", "localhost")                   # discovered, never unspecified
    assert found and found[0] != "0.0.0.0"
    facts = discover_node_facts()
    assert facts.cpu_millis == (os.cpu_count() or 1) * 1000 and facts.memory_bytes > 0


class _CniFake(FakeRuntimeClient):
    """A runtime whose sandboxes get their own IPs, as containerd's with CNI."""

    def run_pod_sandbox(self, config: pb.PodSandboxConfig, runtime_handler: str = "") -> str:
        sid = super().run_pod_sandbox(config, runtime_handler)
        self.sandboxes[sid].network.ip = "10.88.0.5"
        self.sandboxes[sid].network.additional_ips.add(ip="fd00::5")
        return sid


def test_sync_pod_reads_the_sandbox_ips_for_env_only_when_asked(tmp_path: Path) -> None:
    h = Harness(tmp_path, cri=_CniFake(clock=lambda: 1))
    env = [field("status.podIP") | {"name": "IP"}, field("status.podIPs") | {"name": "IPS"},
           field("status.hostIP") | {"name": "HOST"}]
    h.set(manifest("p", "u1", [{"name": "a", "image": "host", "command": ["sleep", "1"],
                                "env": env},
                               {"name": "b", "image": "host", "command": ["echo", "$(X)"],
                                "env": [{"name": "X", "value": "x"}]}]),
          manifest("hn", "u2", [{"name": "a", "image": "host", "command": ["sleep", "1"],
                                 "env": env}], hostNetwork=True))
    configs = {(cfg.labels[L.POD_UID], cfg.metadata.name): cfg
               for _sid, cfg, _sb in h.cri.method_calls("CreateContainer")}
    envs = {key: {kv.key: kv.value for kv in cfg.envs} for key, cfg in configs.items()}
    host = h.sync.node.host_ips[0]
    assert envs[("u1", "a")] == {"IP": "10.88.0.5", "IPS": "10.88.0.5,fd00::5", "HOST": host}
    assert envs[("u2", "a")] == {"IP": host, "IPS": host, "HOST": host}   # hostNetwork
    assert list(configs[("u1", "b")].command) == ["echo", "x"]
    assert all(cfg.linux.resources.oom_score_adj == 1000 for cfg in configs.values())
    # one PodSandboxStatus, for the pod whose env asked for its IP
    assert len(h.cri.method_calls("PodSandboxStatus")) == 1
