"""The trusted rebuild ``pod_from_wire`` is the exact inverse of ``Pod.to_dict()``: for every
manifest, ``pod_from_wire(validate(x).to_dict()) == validate(x)``; anything else on the bus is
refused with a ``PodValidationError`` (never another exception). Its cost: bench/pod_wire.py."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pytest

from podvisor.services.pod import (
    Origin,
    ParsedPod,
    Pod,
    PodValidationError,
    WirePods,
    apply_static_defaults,
    decode_pod,
    pod_from_dict,
    pod_from_wire,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "deploy" / "examples"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml")) + sorted((EXAMPLES / "containerd").glob("*.yaml"))


def _ctr(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "registry.local/app:1.2", **extra}


def kitchen_sink() -> dict[str, Any]:
    """A static pod using every field the model carries."""
    probe = {"initialDelaySeconds": 2, "periodSeconds": 3, "timeoutSeconds": 4,
             "successThreshold": 1, "failureThreshold": 5, "terminationGracePeriodSeconds": 7}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "sink", "namespace": "ns", "uid": "u-1", "labels": {"app": "sink"},
        "annotations": {"note": "x"}, "deletionGracePeriodSeconds": 3}, "spec": {
        "restartPolicy": "OnFailure", "terminationGracePeriodSeconds": 5,
        "hostPID": True, "hostIPC": True, "nodeName": "n1", "priority": 7,
        "dnsPolicy": "Default", "schedulerName": "s", "enableServiceLinks": False,
        "tolerations": [{"key": "k", "operator": "Equal", "value": "v", "effect": "NoExecute",
                         "tolerationSeconds": 30}, {"operator": "Exists"}],
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True,
                            "supplementalGroups": [5, 6], "supplementalGroupsPolicy": "Strict",
                            "fsGroup": 9, "fsGroupChangePolicy": "OnRootMismatch",
                            "seLinuxChangePolicy": "Recursive",
                            "sysctls": [{"name": "net.ipv4.ping_group_range", "value": "0 10"}],
                            "seccompProfile": {"type": "Localhost",
                                               "localhostProfile": "p.json"},
                            "appArmorProfile": {"type": "RuntimeDefault"},
                            "seLinuxOptions": {"user": "u", "level": "s0"}},
        "volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                    {"name": "plain"},
                    {"name": "host", "hostPath": {"path": "/tmp", "type": "Directory"}},
                    {"name": "info", "downwardAPI": {"defaultMode": 0o600, "items": [
                        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                        {"path": "cpu", "mode": 0o644, "resourceFieldRef": {
                            "containerName": "main", "resource": "limits.cpu",
                            "divisor": "1m"}}]}}],
        "imagePullSecrets": [{"name": "regcred"}, {}], "activeDeadlineSeconds": 600,
        "readinessGates": [{"conditionType": "example.com/lb"}],
        "initContainers": [_ctr("init", command=["sh"], args=["-c", "true"],
                                imagePullPolicy="Always"),
                           _ctr("proxy", restartPolicy="Always",
                                startupProbe={"exec": {"command": ["true"]}},
                                lifecycle={"postStart": {"httpGet": {"port": 15000}}})],
        "ephemeralContainers": [_ctr("debugger", targetContainerName="main",
                                     command=["sh"])],
        "containers": [
            _ctr("main", workingDir="/w", env=[
                    {"name": "A", "value": "1"},
                    {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "C", "valueFrom": {"resourceFieldRef": {
                        "resource": "requests.memory"}}}],
                 ports=[{"containerPort": 80, "name": "http", "hostPort": 8080},
                        {"containerPort": 53, "protocol": "UDP"}],
                 resources={"limits": {"cpu": "1500m", "memory": "64Mi",
                                       "hugepages-2Mi": "4Mi"},
                            "requests": {"cpu": "250m"}},
                 livenessProbe={"httpGet": {"port": "http", "path": "/h", "host": "127.0.0.1",
                                            "scheme": "HTTPS", "httpHeaders": [
                                                {"name": "X", "value": "y"}]}, **probe},
                 readinessProbe={"tcpSocket": {"port": 80, "host": "localhost"}},
                 startupProbe={"exec": {"command": ["true"]}},
                 lifecycle={"preStop": {"sleep": {"seconds": 2}},
                            "postStart": {"exec": {"command": ["touch", "/ready"]}},
                            "stopSignal": "SIGRTMIN+1"},
                 volumeMounts=[{"name": "scratch", "mountPath": "/s", "readOnly": True,
                                "subPath": "a"}, {"name": "info", "mountPath": "/info"}],
                 securityContext={"runAsUser": 0, "privileged": False,
                                  "allowPrivilegeEscalation": False,
                                  "readOnlyRootFilesystem": True, "procMount": "Default",
                                  "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]},
                                  "seccompProfile": {"type": "RuntimeDefault"}},
                 terminationMessagePath="/t", terminationMessagePolicy="FallbackToLogsOnError"),
            _ctr("side", readinessProbe={"grpc": {"port": 9000, "service": "h"}},
                 lifecycle={"preStop": {"httpGet": {"port": 80}}},
                 securityContext={}),
            _ctr("last", lifecycle={"preStop": {"exec": {"command": ["stop"]}}},
                 livenessProbe={"grpc": {"port": 9000}},
                 resizePolicy=[{"resourceName": "cpu", "restartPolicy": "NotRequired"},
                               {"resourceName": "memory",
                                "restartPolicy": "RestartContainer"}]),
        ]}, "status": {"phase": "Pending", "conditions": [{"type": "Ready"}]}}


def api_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns",
                                                            "uid": "u"},
            "spec": {"serviceAccountName": "builder", "volumes": [
                {"name": "cfg", "configMap": {"name": "app", "items": [
                    {"key": "k", "path": "dir/k", "mode": 0o600}]}},
                {"name": "sec", "secret": {"secretName": "s", "optional": True}},
                {"name": "acc", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                        "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
                "containers": [{"name": "c", "image": "i", "env": [
                    {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "k"}}},
                    {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k",
                                                                 "optional": True}}}],
                                "envFrom": [{"prefix": "X_", "secretRef": {"name": "s"}},
                                            {"configMapRef": {"name": "c",
                                                              "optional": True}}]}]}}


def _static(parsed: ParsedPod, location: str) -> Pod:
    """As a file source publishes it (its parse warnings in ``podvisor.warnings``)."""
    return apply_static_defaults(parsed.pod, node_name="node", source="file", location=location,
                                 seen="2026-11-25T14:00:00.000000000Z",
                                 warnings=tuple(map(str, parsed.warnings)))


def corpus() -> list[tuple[str, Pod]]:
    parsed = [(p.name, decode_pod(p.read_bytes(), str(p))) for p in EXAMPLE_FILES]
    parsed.append(("kitchen sink", pod_from_dict(kitchen_sink(), "sink")))
    pods = [(name, one.pod) for name, one in parsed]
    pods += [(f"{name} (static)", _static(one, name)) for name, one in parsed]
    api = pod_from_dict(api_pod(), "api", api_objects=True).pod
    pods.append(("api pod", replace(api, origin=Origin("api", "ns/p"))))
    return pods


CORPUS = corpus()


@pytest.mark.parametrize("pod", [p for _, p in CORPUS], ids=[n for n, _ in CORPUS])
def test_rebuild_of_the_wire_form_is_the_validated_pod(pod: Pod) -> None:
    wire = pod.to_dict()
    assert pod_from_wire(wire) == pod
    # as it arrives off the bus: msgpack round trip (lists, no tuples)
    assert pod_from_wire(msgpack.unpackb(msgpack.packb(wire))) == pod
    assert pod_from_wire(wire).to_dict() == wire
    assert pod_from_dict(wire).pod == pod  # the validating path agrees


def test_the_corpus_reaches_every_corner() -> None:
    sink = dict(CORPUS)["kitchen sink"]
    main, side, last = sink.spec.containers
    assert sink.spec.security_context is not None and sink.spec.tolerations
    assert main.resources.limits.hugepages and main.lifecycle.pre_stop is not None
    assert side.readiness_probe is not None and last.liveness_probe is not None


def _broken() -> list[tuple[str, Any]]:
    good = pod_from_dict(kitchen_sink(), "sink").pod.to_dict()

    def edit(path: list[Any], value: Any) -> dict[str, Any]:
        out = copy.deepcopy(good)
        node = out
        for key in path[:-1]:
            node = node[key]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return out

    return [("not a map", ["pod"]), ("none", None), ("a Service", {**good, "kind": "Service"}),
            ("no metadata", edit(["metadata"], KeyError)),
            ("no containers", edit(["spec", "containers"], KeyError)),
            ("bad enum", edit(["spec", "restartPolicy"], "Sometimes")),
            ("container not a map", edit(["spec", "containers", 0], "main")),
            ("bad cpu", edit(["spec", "containers", 0, "resources", "limits", "cpu"], "lots")),
            ("probe sleeps", edit(["spec", "containers", 0, "livenessProbe"],
                                  {"sleep": {"seconds": 1}})),
            ("unknown volume", edit(["spec", "volumes", 0], {"name": "v", "glusterfs": {}}))]


@pytest.mark.parametrize(("name", "wire"), _broken(), ids=[n for n, _ in _broken()])
def test_something_else_is_refused_with_a_validation_error(name: str, wire: Any) -> None:
    with pytest.raises(PodValidationError) as err:
        pod_from_wire(wire, "desired[u-1]")
    assert err.value.where == "desired[u-1]"
    assert "not a validated pod wire form" in str(err.value)


def test_wire_pods_rebuild_a_pod_only_when_its_wire_form_changed() -> None:
    """``WirePods``: one typed pod per map key, rebuilt when that key's wire form changed (the
    same dict object, or an equal one, is a hit); forgotten when its key leaves the map."""
    wire = pod_from_dict(kitchen_sink()).pod.to_dict()
    pods = WirePods()
    first = pods.get("u1", wire)
    assert first == pod_from_wire(wire) and pods.rebuilds == 1
    assert pods.get("u1", wire) is first and pods.get("u1", copy.deepcopy(wire)) is first
    assert pods.rebuilds == 1
    renamed = copy.deepcopy(wire)
    renamed["metadata"]["name"] = "other"
    assert pods.get("u1", renamed).name == "other" and pods.rebuilds == 2
    pods.get("u2", wire)
    pods.retain({"u2"})
    assert pods.get("u1", renamed).name == "other" and pods.rebuilds == 4  # forgotten: again
    with pytest.raises(PodValidationError):
        pods.get("u3", {"kind": "Pod"})
