"""The API server's defaults, one test per field (services/pod/defaults.py), and the static
pod's UID over the defaulted pod."""

from __future__ import annotations

from typing import Any

import pytest

from podvisor.services.pod import apply_static_defaults, pod_from_dict
from podvisor.services.pod.defaults import DEFAULTS, STATIC_POD_TOLERATION


def bare() -> dict[str, Any]:
    """A manifest holding every object that has defaults, with none of the defaulted fields."""
    probe = {"httpGet": {"port": 8080}}
    container = {"name": "c", "image": "busybox:1.36", "command": ["sleep", "1"],
                 "ports": [{"containerPort": 8080}],
                 "env": [{"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                 "livenessProbe": dict(probe), "readinessProbe": dict(probe),
                 "startupProbe": dict(probe)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [container],
                     "initContainers": [{"name": "i", "image": "busybox:1.36"}],
                     "volumes": [{"name": "d", "downwardAPI": {"items": [
                         {"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}},
                         {"name": "h", "hostPath": {"path": "/tmp"}}]}}


def lookup(obj: Any, path: str) -> Any:
    """Follow ``a.b[].c`` (``[]``: in the list, the first item holding the next key)."""
    for part in path.split("."):
        key = part.removesuffix("[]")
        if isinstance(obj, list):
            obj = next(item for item in obj if key in item)
        obj = obj[key]
    return obj


@pytest.mark.parametrize("default", DEFAULTS, ids=[d.path for d in DEFAULTS])
def test_each_default_shows_in_the_wire_form(default: Any) -> None:
    wire = pod_from_dict(bare()).pod.to_dict()
    assert lookup(wire, default.path) == default.value


@pytest.mark.parametrize("default", DEFAULTS, ids=[d.path for d in DEFAULTS])
def test_each_default_round_trips(default: Any) -> None:
    pod = pod_from_dict(bare()).pod
    assert pod_from_dict(pod.to_dict()).pod == pod


def test_a_set_value_is_kept() -> None:
    doc = bare()
    doc["spec"].update(dnsPolicy="Default", schedulerName="mine", enableServiceLinks=False)
    doc["spec"]["containers"][0]["terminationMessagePolicy"] = "FallbackToLogsOnError"
    parsed = pod_from_dict(doc)
    spec = parsed.pod.to_dict()["spec"]
    assert (spec["dnsPolicy"], spec["schedulerName"], spec["enableServiceLinks"]) == (
        "Default", "mine", False)
    assert spec["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert parsed.warnings == ()  # [issue 24] termination messages are collected


def test_volume_without_a_source_is_an_empty_dir() -> None:
    doc = bare()
    doc["spec"]["volumes"].append({"name": "scratch"})
    assert pod_from_dict(doc).pod.to_dict()["spec"]["volumes"][2] == {
        "name": "scratch", "emptyDir": {}}


def test_image_pull_policy_from_the_tag() -> None:
    doc = bare()
    doc["spec"]["containers"][0]["image"] = "busybox"
    doc["spec"]["initContainers"][0]["image"] = "busybox:latest"
    spec = pod_from_dict(doc).pod.to_dict()["spec"]
    assert spec["containers"][0]["imagePullPolicy"] == "Always"
    assert spec["initContainers"][0]["imagePullPolicy"] == "Always"
    assert pod_from_dict(bare()).pod.to_dict()["spec"]["containers"][0][
        "imagePullPolicy"] == "IfNotPresent"


def test_requests_default_to_limits() -> None:
    doc = bare()
    doc["spec"]["initContainers"][0]["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}}
    res = pod_from_dict(doc).pod.to_dict()["spec"]["initContainers"][0]["resources"]
    assert res["requests"] == {"cpu": "1", "memory": 2**30}


def test_host_port_defaults_with_host_network() -> None:
    doc = bare()
    doc["spec"]["hostNetwork"] = True
    port = pod_from_dict(doc).pod.to_dict()["spec"]["containers"][0]["ports"][0]
    assert port["hostPort"] == 8080


def static(doc: dict[str, Any], source: str = "file") -> dict[str, Any]:
    pod = pod_from_dict(doc).pod
    return apply_static_defaults(pod, node_name="n1", source=source, location="/p.yaml",
                                 seen="t").to_dict()


def test_file_pods_get_the_no_execute_toleration_once() -> None:
    assert static(bare())["spec"]["tolerations"] == [STATIC_POD_TOLERATION]
    doc = bare()
    doc["spec"]["tolerations"] = [{"key": "k", "operator": "Equal", "value": "v",
                                   "effect": "NoSchedule"}, dict(STATIC_POD_TOLERATION)]
    assert static(doc)["spec"]["tolerations"] == doc["spec"]["tolerations"]
    assert "tolerations" not in static(bare(), "http")["spec"]


def test_uid_is_the_hash_of_the_defaulted_pod() -> None:
    """Spelling a default out or leaving it to the defaults is the same pod, the same UID
    (the kubelet hashes the decoded, defaulted pod); the toleration is added after."""
    doc = bare()
    spelled = bare()
    spelled["spec"].update(dnsPolicy="ClusterFirst", schedulerName="default-scheduler",
                           enableServiceLinks=True, securityContext={},
                           restartPolicy="Always", terminationGracePeriodSeconds=30)
    spelled["spec"]["containers"][0]["terminationMessagePath"] = "/dev/termination-log"
    assert static(doc)["metadata"]["uid"] == static(spelled)["metadata"]["uid"]
    spelled["spec"]["dnsPolicy"] = "Default"
    assert static(doc)["metadata"]["uid"] != static(spelled)["metadata"]["uid"]
