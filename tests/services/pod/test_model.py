"""Pod model: parse, validate, default, round trip (pure, no I/O)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from podvisor.services.pod import (
    ContainerPort,
    EmptyDirVolume,
    ExecAction,
    GRPCAction,
    HostPathType,
    HTTPGetAction,
    PodValidationError,
    PullPolicy,
    RestartPolicy,
    SleepAction,
    TCPSocketAction,
    decode_pod,
    decode_pod_or_list,
    pod_from_dict,
    pod_from_wire,
)

WEB = """\
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
  annotations: {note: hello}
spec:
  containers:
  - name: web
    image: host
    command: [python3, -m, http.server, "8080", --bind, 127.0.0.1]
    args: ["-d", /tmp]
    env: [{name: A, value: "1"}, {name: B}]
    workingDir: /tmp
    ports: [{containerPort: 8080, name: http}]
    resources:
      limits: {cpu: 500m, memory: 128Mi}
      requests: {cpu: "0.25"}
    readinessProbe:
      httpGet: {port: http, path: /healthz, httpHeaders: [{name: X, value: y}]}
      periodSeconds: 2
    livenessProbe:
      tcpSocket: {port: 8080}
    startupProbe:
      exec: {command: ["true"]}
      failureThreshold: 30
    lifecycle: {preStop: {sleep: {seconds: 2}}}
    volumeMounts: [{name: data, mountPath: /data}, {name: etc, mountPath: /e, readOnly: true}]
  initContainers:
  - name: init
    image: busybox:1.36
    command: [sh, -c, "echo init"]
  restartPolicy: OnFailure
  terminationGracePeriodSeconds: 5
  volumes:
  - {name: data, emptyDir: {sizeLimit: 1Gi}}
  - {name: etc, hostPath: {path: /etc, type: Directory}}
  priority: 7
"""


def manifest(**spec_overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                           "spec": {"containers": [{"name": "c", "image": "host"}]}}
    doc["spec"].update(spec_overrides)
    return doc


def errors_of(obj: Any) -> list[str]:
    with pytest.raises(PodValidationError) as info:
        pod_from_dict(obj, "pods/x.yaml")
    return [str(e) for e in info.value.errors]


def test_full_manifest_parses_with_defaults() -> None:
    parsed = decode_pod(WEB.encode(), "pods/web.yaml")
    assert [(w.field, w.reason) for w in parsed.warnings] == [
        ("spec.volumes[0].emptyDir.sizeLimit",
         "enforced by eviction for API pods only (a static pod is never evicted)")]
    pod = parsed.pod
    web = pod.spec.containers[0]
    assert pod.name == "web" and pod.metadata.labels == {"app": "web"}
    assert web.command[3] == "8080" and web.args == ("-d", "/tmp")
    assert [(e.name, e.value) for e in web.env] == [("A", "1"), ("B", "")]
    assert web.ports == (ContainerPort(8080, 0, name="http"),)
    assert web.resources.limits.cpu_millis == 500
    assert web.resources.limits.memory_bytes == 128 * 2**20
    assert web.resources.requests.cpu_millis == 250
    assert web.resources.requests.memory_bytes == 128 * 2**20  # defaulted from the limit
    assert web.readiness_probe is not None and web.readiness_probe.period_seconds == 2
    assert isinstance(web.readiness_probe.handler, HTTPGetAction)
    assert web.readiness_probe.handler.port == "http"
    assert web.liveness_probe is not None
    assert isinstance(web.liveness_probe.handler, TCPSocketAction)
    assert (web.liveness_probe.period_seconds, web.liveness_probe.timeout_seconds,
            web.liveness_probe.success_threshold, web.liveness_probe.failure_threshold,
            web.liveness_probe.initial_delay_seconds) == (10, 1, 1, 3, 0)
    assert web.startup_probe is not None
    assert isinstance(web.startup_probe.handler, ExecAction)
    assert web.lifecycle.pre_stop == SleepAction(2)
    assert web.image_pull_policy is PullPolicy.ALWAYS  # untagged
    assert pod.spec.init_containers[0].image_pull_policy is PullPolicy.IF_NOT_PRESENT
    assert pod.spec.restart_policy is RestartPolicy.ON_FAILURE
    assert pod.spec.termination_grace_period_seconds == 5
    assert pod.spec.volumes[0].source == EmptyDirVolume(size_limit_bytes=2**30)
    assert pod.spec.volumes[1].source.type is HostPathType.DIRECTORY  # type: ignore[union-attr]
    assert pod.spec.priority == 7


def test_minimal_pod_defaults() -> None:
    pod = pod_from_dict(manifest()).pod
    assert pod.spec.restart_policy is RestartPolicy.ALWAYS
    assert pod.spec.termination_grace_period_seconds == 30
    assert pod.spec.host_network is False and pod.status == {}
    assert pod.all_containers()[0].name == "c"


def test_json_manifest() -> None:
    parsed = decode_pod(json.dumps(manifest()).encode(), "pods/p.json")
    assert parsed.pod.spec.containers[0].image == "host"


@pytest.mark.parametrize("image,policy", [
    ("host", PullPolicy.ALWAYS), ("busybox:latest", PullPolicy.ALWAYS),
    ("localhost:5000/busybox", PullPolicy.ALWAYS), ("localhost:5000/busybox:1", "IfNotPresent"),
    ("busybox@sha256:" + "a" * 64, PullPolicy.IF_NOT_PRESENT),
])
def test_image_pull_policy_default(image: str, policy: str) -> None:
    doc = manifest(containers=[{"name": "c", "image": image}])
    assert pod_from_dict(doc).pod.spec.containers[0].image_pull_policy == policy


def test_round_trip_is_exact() -> None:
    pod = decode_pod(WEB.encode(), "pods/web.yaml").pod
    wire = pod.to_dict()
    again = pod_from_dict(json.loads(json.dumps(wire)))
    # emptyDir.sizeLimit is warned about and kept (see test_empty_dir_medium_and_size_warned)
    assert again.pod == pod and len(again.warnings) == 1
    assert again.pod.to_dict() == wire


def test_round_trip_keeps_every_probe_kind() -> None:
    doc = manifest(containers=[{
        "name": "c", "image": "host",
        "livenessProbe": {"grpc": {"port": 9090, "service": "s"},
                          "terminationGracePeriodSeconds": 3},
        "readinessProbe": {"exec": {"command": ["true"]}, "successThreshold": 2},
        "lifecycle": {"preStop": {"httpGet": {"port": 80, "host": "h", "scheme": "HTTPS"}}},
    }], hostNetwork=True)
    pod = pod_from_dict(doc).pod
    c = pod.spec.containers[0]
    assert c.liveness_probe is not None and c.liveness_probe.handler == GRPCAction(9090, "s")
    assert pod_from_dict(pod.to_dict()).pod == pod


def test_host_network_defaults_host_port() -> None:
    doc = manifest(hostNetwork=True,
                   containers=[{"name": "c", "image": "host", "ports": [{"containerPort": 80}]}])
    assert pod_from_dict(doc).pod.spec.containers[0].ports[0].host_port == 80


def test_timestamps_stay_strings() -> None:
    text = WEB.replace("  name: web\n", "  name: web\n  deletionTimestamp: 2024-05-01T10:00:00Z\n"
                       "  deletionGracePeriodSeconds: 3\n")
    pod = decode_pod(text.encode(), "pods/web.yaml").pod
    assert pod.metadata.deletion_timestamp == "2024-05-01T10:00:00Z"
    assert pod.metadata.deletion_grace_period_seconds == 3


REJECTED = [
    # (description, mutate(doc), expected substring of one error line)
    ("wrong kind", lambda d: d.update(kind="Deployment", apiVersion="apps/v1"),
     "kind: expected a Pod, got 'Deployment'"),
    ("missing image", lambda d: d["spec"]["containers"][0].pop("image"),
     "spec.containers[0].image: required"),
    ("empty image", lambda d: d["spec"]["containers"][0].update(image=""),
     "spec.containers[0].image: required"),
    ("no containers", lambda d: d["spec"].update(containers=[]),
     "spec.containers: required"),
    ("duplicate container", lambda d: d["spec"].update(
        initContainers=[{"name": "c", "image": "host"}]),
     "spec.containers[0].name: duplicate container name 'c'"),
    ("bad restartPolicy", lambda d: d["spec"].update(restartPolicy="Sometimes"),
     "spec.restartPolicy: unsupported value 'Sometimes'"),
    ("bad pod name", lambda d: d["metadata"].update(name="Web_1"),
     "metadata.name: 'Web_1' is not a valid DNS-1123 subdomain"),
    ("bad container name", lambda d: d["spec"]["containers"][0].update(name="a.b"),
     "spec.containers[0].name: 'a.b' is not a valid DNS-1123 label"),
    ("missing name", lambda d: d["metadata"].pop("name"), "metadata.name: required"),
    ("missing spec", lambda d: d.pop("spec"), "spec: required"),
    ("wrong apiVersion", lambda d: d.update(apiVersion="v2"), "apiVersion: expected 'v1'"),
    ("number in command", lambda d: d["spec"]["containers"][0].update(command=["sleep", 5]),
     "spec.containers[0].command[1]: must be a string"),
    ("secret volume", lambda d: d["spec"].update(volumes=[{"name": "s", "secret": {}}]),
     "spec.volumes[0].secret: static pods may not reference API objects (Secret volume)"),
    ("configMap volume", lambda d: d["spec"].update(volumes=[{"name": "s", "configMap": {}}]),
     "static pods may not reference API objects (ConfigMap volume)"),
    ("pvc volume", lambda d: d["spec"].update(
        volumes=[{"name": "s", "persistentVolumeClaim": {"claimName": "x"}}]),
     "(PersistentVolumeClaim volume: as with the kubelet, the API server refuses "
     "the mirror pod of a static pod that references a claim)"),
    ("projected volume", lambda d: d["spec"].update(volumes=[{"name": "s", "projected": {}}]),
     "(projected volume)"),
    ("glusterfs volume", lambda d: d["spec"].update(volumes=[{"name": "s", "glusterfs": {}}]),
     "spec.volumes[0].glusterfs: unsupported volume type"),
    ("flexVolume secretRef", lambda d: d["spec"].update(volumes=[{"name": "s", "flexVolume": {
        "driver": "example.com/x", "secretRef": {"name": "creds"}}}]),
     "spec.volumes[0].flexVolume.secretRef: static pods may not reference API objects "
     "(Secret via secretRef)"),
    ("service account", lambda d: d["spec"].update(serviceAccountName="robot"),
     "spec.serviceAccountName: static pods may not reference API objects (ServiceAccount"),
    ("envFrom", lambda d: d["spec"]["containers"][0].update(envFrom=[{"secretRef": {}}]),
     "spec.containers[0].envFrom: static pods may not reference API objects"),
    ("secretKeyRef", lambda d: d["spec"]["containers"][0].update(
        env=[{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]),
     "spec.containers[0].env[0].valueFrom.secretKeyRef: static pods may not reference API "
     "objects (Secret)"),
    ("configMapKeyRef", lambda d: d["spec"]["containers"][0].update(
        env=[{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "s", "key": "k"}}}]),
     "(ConfigMap)"),
    ("configMapKeyRef", lambda d: d["spec"]["containers"][0].update(
        env=[{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]),
     "env[0].valueFrom.configMapKeyRef: static pods may not reference API objects (ConfigMap) "
     "(only pods from the API server may)"),
    # [issue 24] the API server's own rules for the pod lifecycle fields podvisor now honours
    ("sidecar policy other than Always", lambda d: d["spec"].update(
        initContainers=[{"name": "s", "image": "host", "restartPolicy": "Never"}]),
     'spec.initContainers[0].restartPolicy: Unsupported value: "Never": supported values: '
     '"Always"'),
    ("restartPolicy on a regular container", lambda d: d["spec"]["containers"][0].update(
        restartPolicy="Always"),
     "spec.containers[0].restartPolicy: Forbidden: may not be set for non-init containers"),
    ("postStart tcpSocket without a port", lambda d: d["spec"]["containers"][0].update(
        lifecycle={"postStart": {"tcpSocket": {}}}),
     "lifecycle.postStart.tcpSocket.port"),
    ("recursiveReadOnly without readOnly", lambda d: d["spec"].update(
        volumes=[{"name": "v", "emptyDir": {}}],
        containers=[{"name": "c", "image": "host", "volumeMounts": [
            {"name": "v", "mountPath": "/v", "recursiveReadOnly": "Enabled"}]}]),
     "volumeMounts[0].recursiveReadOnly: Forbidden: may only be specified when readOnly is "
     "true"),
    ("recursiveReadOnly with propagation", lambda d: d["spec"].update(
        volumes=[{"name": "v", "emptyDir": {}}],
        containers=[{"name": "c", "image": "host", "volumeMounts": [
            {"name": "v", "mountPath": "/v", "readOnly": True, "recursiveReadOnly": "IfPossible",
             "mountPropagation": "HostToContainer"}]}]),
     "recursiveReadOnly: Forbidden: may only be specified when mountPropagation is None or not "
     "specified"),
    ("recursiveReadOnly value", lambda d: d["spec"].update(
        volumes=[{"name": "v", "emptyDir": {}}],
        containers=[{"name": "c", "image": "host", "volumeMounts": [
            {"name": "v", "mountPath": "/v", "readOnly": True, "recursiveReadOnly": "Always"}]}]),
     "recursiveReadOnly: Unsupported value: 'Always'"),
    ("runtimeClassName", lambda d: d["spec"].update(runtimeClassName="Not_A_Name"),
     "spec.runtimeClassName: 'Not_A_Name' is not a valid DNS-1123 subdomain"),
    ("activeDeadlineSeconds 0", lambda d: d["spec"].update(activeDeadlineSeconds=0),
     "spec.activeDeadlineSeconds: must be at least 1"),
    ("readiness gate type", lambda d: d["spec"].update(
        readinessGates=[{"conditionType": "a b"}]),
     "spec.readinessGates[0].conditionType:"),
    ("ephemeral container with ports", lambda d: d["spec"].update(ephemeralContainers=[
        {"name": "dbg", "image": "host", "ports": [{"containerPort": 80}]}]),
     "spec.ephemeralContainers[0].ports: Forbidden: cannot be set for an Ephemeral Container"),
    ("ephemeral target", lambda d: d["spec"].update(ephemeralContainers=[
        {"name": "dbg", "image": "host", "targetContainerName": "nope"}]),
     'spec.ephemeralContainers[0].targetContainerName: Not found: "nope"'),
    ("ephemeral name taken", lambda d: d["spec"].update(ephemeralContainers=[
        {"name": "c", "image": "host"}]),
     "spec.ephemeralContainers[0].name: duplicate container name 'c'"),
    ("probe without handler", lambda d: d["spec"]["containers"][0].update(
        livenessProbe={"periodSeconds": 3}),
     "spec.containers[0].livenessProbe: must specify a handler"),
    ("probe with two handlers", lambda d: d["spec"]["containers"][0].update(
        livenessProbe={"exec": {"command": ["x"]}, "tcpSocket": {"port": 1}}),
     "must specify only one handler, found exec and tcpSocket"),
    ("liveness success 2", lambda d: d["spec"]["containers"][0].update(
        livenessProbe={"exec": {"command": ["x"]}, "successThreshold": 2}),
     "livenessProbe.successThreshold: must be 1"),
    ("period 0", lambda d: d["spec"]["containers"][0].update(
        readinessProbe={"exec": {"command": ["x"]}, "periodSeconds": 0}),
     "readinessProbe.periodSeconds: must be at least 1"),
    ("unknown named port", lambda d: d["spec"]["containers"][0].update(
        readinessProbe={"httpGet": {"port": "web"}}),
     "readinessProbe.httpGet.port: no container port named 'web'"),
    ("port out of range", lambda d: d["spec"]["containers"][0].update(
        ports=[{"containerPort": 70000}]),
     "ports[0].containerPort: must be at most 65535"),
    ("mount of unknown volume", lambda d: d["spec"]["containers"][0].update(
        volumeMounts=[{"name": "v", "mountPath": "/v"}]),
     "volumeMounts[0].name: no volume named 'v'"),
    ("relative hostPath", lambda d: d["spec"].update(
        volumes=[{"name": "v", "hostPath": {"path": "etc"}}]),
     "spec.volumes[0].hostPath.path: must be an absolute path"),
    ("bad cpu", lambda d: d["spec"]["containers"][0].update(
        resources={"limits": {"cpu": "lots"}}),
     "resources.limits.cpu: 'lots' is not a valid quantity"),
    ("request over limit", lambda d: d["spec"]["containers"][0].update(
        resources={"limits": {"memory": "1Mi"}, "requests": {"memory": "2Mi"}}),
     "resources.requests.memory: must be less than or equal to memory limit"),
    ("extended resource", lambda d: d["spec"]["containers"][0].update(
        resources={"limits": {"nvidia.com/gpu": 1}}),
     "extended resource 'nvidia.com/gpu' is not available"),
    ("negative grace", lambda d: d["spec"].update(terminationGracePeriodSeconds=-1),
     "spec.terminationGracePeriodSeconds: must be at least 0"),
    ("label value", lambda d: d["metadata"].update(labels={"a": "b c"}),
     "metadata.labels.a: 'b c' is not a valid label value"),
    ("label not a string", lambda d: d["metadata"].update(labels={"a": 1}),
     "metadata.labels.a: must be a string"),
    ("bool as string", lambda d: d["spec"].update(hostNetwork="yes"),
     "spec.hostNetwork: must be true or false"),
    ("bad deletion timestamp", lambda d: d["metadata"].update(deletionTimestamp="yesterday"),
     "metadata.deletionTimestamp: 'yesterday' is not an RFC 3339 time"),
]


@pytest.mark.parametrize("mutate,expected", [(m, e) for _, m, e in REJECTED],
                         ids=[name for name, _, _ in REJECTED])
def test_rejected(mutate: Any, expected: str) -> None:
    doc = manifest()
    mutate(doc)
    errors = errors_of(doc)
    assert any(expected in line for line in errors), errors


def test_error_names_file_and_field() -> None:
    doc = manifest()
    doc["spec"]["containers"][0].pop("image")
    with pytest.raises(PodValidationError) as info:
        pod_from_dict(doc, "pods/web.yaml")
    assert str(info.value) == "pods/web.yaml: spec.containers[0].image: required"
    assert info.value.where == "pods/web.yaml"


def test_pod_lifecycle_fields_are_kept() -> None:
    """[issue 24] imagePullSecrets, postStart, a sidecar, an ephemeral container,
    activeDeadlineSeconds, readinessGates and the termination message settings are kept in the
    model and its wire form, with no warning (a static pod may name pull secrets: the kubelet
    reads them when it can, else pulls with the node's credentials)."""
    doc = manifest(
        imagePullSecrets=[{"name": "regcred"}, {}], activeDeadlineSeconds=30,
        readinessGates=[{"conditionType": "example.com/ready"}],
        initContainers=[{"name": "side", "image": "host", "restartPolicy": "Always",
                         "readinessProbe": {"exec": {"command": ["true"]}}}],
        ephemeralContainers=[{"name": "dbg", "image": "host", "targetContainerName": "c",
                              "command": ["sh"], "resources": {},  # as kubectl debug sends
                              "terminationMessagePolicy": "File"}])
    doc["spec"]["containers"][0].update(
        lifecycle={"postStart": {"exec": {"command": ["touch", "/x"]}},
                   "preStop": {"sleep": {"seconds": 1}}},
        terminationMessagePath="/tmp/msg", terminationMessagePolicy="FallbackToLogsOnError")
    parsed = pod_from_dict(doc, "pods/x.yaml")
    assert parsed.warnings == ()
    spec = parsed.pod.spec
    assert spec.image_pull_secrets == ("regcred", "")
    assert spec.active_deadline_seconds == 30
    assert spec.readiness_gates == ("example.com/ready",)
    assert [c.name for c in spec.sidecars] == ["side"]
    assert spec.ephemeral_containers[0].target_container_name == "c"
    app = spec.containers[0]
    assert app.lifecycle.post_start is not None and app.lifecycle.pre_stop is not None
    assert app.termination_message_path == "/tmp/msg"
    wire = parsed.pod.to_dict()
    assert wire["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {}]
    assert wire["spec"]["initContainers"][0]["restartPolicy"] == "Always"
    assert wire["spec"]["ephemeralContainers"][0]["targetContainerName"] == "c"
    assert pod_from_dict(wire).pod == parsed.pod


def test_every_error_reported_at_once() -> None:
    doc = manifest(restartPolicy="Bad", containers=[{"name": "A"}, {"name": "A", "image": 1}])
    errors = errors_of(doc)
    assert len(errors) >= 4, errors


WARNED = [
    ("windowsOptions", lambda d: d["spec"]["containers"][0].update(
        securityContext={"windowsOptions": {"runAsUserName": "x"}}),
     "spec.containers[0].securityContext.windowsOptions"),
    ("unknown spec field", lambda d: d["spec"].update(frobnicate=1), "spec.frobnicate"),
    ("unknown container field", lambda d: d["spec"]["containers"][0].update(colour="red"),
     "spec.containers[0].colour"),
    ("creationTimestamp", lambda d: d["metadata"].update(creationTimestamp="2024-01-01T00:00Z"),
     "metadata.creationTimestamp"),
    ("affinity", lambda d: d["spec"].update(affinity={"nodeAffinity": {}}), "spec.affinity"),
    ("unknown top-level", lambda d: d.update(extra=1), "extra"),
]


@pytest.mark.parametrize("mutate,field", [(m, f) for _, m, f in WARNED],
                         ids=[name for name, _, _ in WARNED])
def test_unsupported_fields_warned_not_ignored(mutate: Any, field: str) -> None:
    doc = manifest()
    mutate(doc)
    parsed = pod_from_dict(doc, "pods/x.yaml")
    assert any(w.field.endswith(field) for w in parsed.warnings), parsed.warnings
    assert pod_from_dict(parsed.pod.to_dict()).warnings == ()


def test_ephemeral_storage_is_kept_for_eviction() -> None:
    """``ephemeral-storage`` requests and limits are kept (eviction enforces them, issue 27);
    requests default to the limits."""
    doc = manifest()
    doc["spec"]["containers"][0]["resources"] = {"limits": {"ephemeral-storage": "1Gi"}}
    parsed = pod_from_dict(doc, "pods/x.yaml")
    assert parsed.warnings == ()
    res = parsed.pod.spec.containers[0].resources
    assert res.limits.ephemeral_storage_bytes == res.requests.ephemeral_storage_bytes == 1 << 30
    again = pod_from_dict(parsed.pod.to_dict())
    assert again.pod == parsed.pod and again.warnings == ()


def test_empty_dir_medium_and_size_warned_and_kept() -> None:
    """Warned, not dropped: dropping them would change the wire form and with it the UID of a
    static pod that has them, so an upgrade would restart it."""
    doc = manifest(volumes=[{"name": "m", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
                            {"name": "d", "emptyDir": {}}])
    parsed = pod_from_dict(doc, "pods/x.yaml")
    assert [w.field for w in parsed.warnings] == ["spec.volumes[0].emptyDir.medium",
                                                  "spec.volumes[0].emptyDir.sizeLimit"]
    assert "Memory (tmpfs) is not supported" in parsed.warnings[0].reason
    assert parsed.pod.to_dict()["spec"]["volumes"][0] == {
        "name": "m", "emptyDir": {"medium": "Memory", "sizeLimit": 64 * 2**20}}


def test_null_fields_count_as_absent() -> None:
    doc = manifest(dnsPolicy=None, volumes=None)
    doc["metadata"]["creationTimestamp"] = None
    doc["status"] = {}
    assert pod_from_dict(doc).warnings == ()


@pytest.mark.parametrize("data,expected", [
    (b"apiVersion: v1\nkind: Pod\nmetadata: {name: [\n", "invalid YAML"),
    (b"", "empty manifest"),
    (b"   \n# just a comment\n", "empty manifest"),
    (b"\xff\xfe\x00", "not UTF-8"),
    (b"- 1\n- 2\n", "must be an object"),
    (yaml.safe_dump(manifest()).encode() + b"---\n" + yaml.safe_dump(manifest()).encode(),
     "found 2 YAML documents; put one Pod per file"),
    (b"{\"kind\": \"Pod\",", "invalid YAML"),
])
def test_bad_documents(data: bytes, expected: str) -> None:
    with pytest.raises(PodValidationError) as info:
        decode_pod(data, "pods/bad.yaml")
    assert expected in str(info.value)
    assert str(info.value).startswith("pods/bad.yaml: ")


def test_oversized_document_rejected_before_parsing() -> None:
    with pytest.raises(PodValidationError, match="larger than 10 MiB"):
        decode_pod(b"#" * (20 * 1024 * 1024), "pods/big.yaml")


def test_yaml_alias_bomb_is_bounded() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}]"
              for i in range(1, 9)]
    doc = yaml.safe_dump(manifest()) + "status:\n" + "".join(f"  {line}\n" for line in lines)
    with pytest.raises(PodValidationError, match="once YAML aliases are expanded"):
        decode_pod(doc.encode(), "pods/bomb.yaml")


def test_status_is_bounded() -> None:
    doc = manifest()
    doc["status"] = {"big": list(range(20_000))}
    with pytest.raises(PodValidationError, match="status: too large"):
        pod_from_dict(doc, "pods/x.yaml")


def test_pod_list() -> None:
    bad = manifest()
    bad["spec"]["containers"][0].pop("image")
    body = json.dumps({"kind": "PodList", "apiVersion": "v1", "items": [manifest(), bad]})
    pods, errors = decode_pod_or_list(body.encode(), "http://x/pods")
    assert [p.pod.name for p in pods] == ["p"]
    assert [str(e) for e in errors] == ["http://x/pods: items[1].spec.containers[0].image: "
                                        "required"]


def test_several_unnamed_ports_are_allowed_and_named_ones_must_differ() -> None:
    from podvisor.services.pod import PodValidationError, pod_from_dict

    def pod(ports: list[dict[str, object]]) -> dict[str, object]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                "spec": {"containers": [{"name": "c", "image": "host", "ports": ports}]}}

    parsed = pod_from_dict(pod([{"containerPort": 80}, {"containerPort": 81}]), "p.yaml")
    assert [p.container_port for p in parsed.pod.spec.containers[0].ports] == [80, 81]
    with pytest.raises(PodValidationError, match="duplicate port name 'web'"):
        pod_from_dict(pod([{"containerPort": 80, "name": "web"},
                           {"containerPort": 81, "name": "web"}]), "p.yaml")


def test_stop_signal() -> None:
    """``lifecycle.stopSignal``: the API's signal names, kept in the wire form, sent as CRI's
    ``stop_signal`` (SIGRTMIN+1 -> SIGRTMINPLUS1); an unknown name is refused."""
    from cri_api.v1 import api_pb2 as pb

    from podvisor.services.syncloop import cri_config

    doc = manifest(containers=[{"name": "c", "image": "host",
                                "lifecycle": {"stopSignal": "SIGRTMIN+1"}}])
    pod = pod_from_dict(doc).pod
    c = pod.spec.containers[0]
    assert c.lifecycle.stop_signal == "SIGRTMIN+1"
    assert pod.to_dict()["spec"]["containers"][0]["lifecycle"] == {"stopSignal": "SIGRTMIN+1"}
    config = cri_config.container_config(pod, c, 0, {})
    assert config.stop_signal == pb.SIGRTMINPLUS1
    plain = pod_from_dict(manifest()).pod
    assert cri_config.container_config(plain, plain.spec.containers[0], 0, {}).stop_signal \
        == pb.RUNTIME_DEFAULT
    bad = manifest(containers=[{"name": "c", "image": "host",
                                "lifecycle": {"stopSignal": "SIGFLY"}}])
    assert any("stopSignal: Unsupported value: 'SIGFLY'" in e for e in errors_of(bad))


def test_tcp_socket_lifecycle_handlers_are_kept() -> None:
    """``tcpSocket`` in ``preStop`` and ``postStart`` passes the API server's validation and
    the kubelet runs the pod (its handler runner fails the hook when it runs: syncloop/hooks.py):
    kept, round-tripped, no warning; refused (postStart) or dropped (preStop) before issue 24's
    last round."""
    doc = manifest(containers=[{"name": "c", "image": "host", "ports": [
        {"name": "http", "containerPort": 8080}], "lifecycle": {
        "preStop": {"tcpSocket": {"port": 80}}, "postStart": {"tcpSocket": {
            "port": "http", "host": "10.0.0.1"}}, "stopSignal": "SIGINT"}}])
    parsed = pod_from_dict(doc)
    lifecycle = parsed.pod.spec.containers[0].lifecycle
    assert lifecycle.pre_stop == TCPSocketAction(80)
    assert lifecycle.post_start == TCPSocketAction("http", "10.0.0.1")
    assert lifecycle.stop_signal == "SIGINT" and not parsed.warnings
    assert pod_from_dict(parsed.pod.to_dict()).pod == parsed.pod
    assert pod_from_wire(parsed.pod.to_dict()) == parsed.pod
    both = manifest(containers=[{"name": "c", "image": "host", "lifecycle": {
        "preStop": {"tcpSocket": {"port": 80}, "exec": {"command": ["x"]}}}}])
    assert any("must specify only one handler" in e for e in errors_of(both))
    named = manifest(containers=[{"name": "c", "image": "host", "lifecycle": {
        "postStart": {"tcpSocket": {"port": "nope"}}}}])
    assert any("no container port named 'nope'" in e for e in errors_of(named))


def test_recursive_read_only_and_runtime_class_are_kept() -> None:
    """``recursiveReadOnly`` and ``runtimeClassName`` (issue 24): kept and round-tripped."""
    doc = manifest(runtimeClassName="gvisor", volumes=[{"name": "v", "emptyDir": {}}],
                   containers=[{"name": "c", "image": "host", "volumeMounts": [
                       {"name": "v", "mountPath": "/v", "readOnly": True,
                        "recursiveReadOnly": "IfPossible", "mountPropagation": "None"}]}])
    parsed = pod_from_dict(doc)
    assert not parsed.warnings
    p = parsed.pod
    assert p.spec.runtime_class_name == "gvisor"
    assert p.spec.containers[0].volume_mounts[0].recursive_read_only == "IfPossible"
    assert pod_from_dict(p.to_dict()).pod == p
    assert pod_from_wire(p.to_dict()) == p


def test_a_pod_for_another_os_is_refused() -> None:
    """``spec.os.name``: linux runs (the field warned, as before); windows is refused as the
    kubelet's admission refuses it (PodOSNotSupported); another name fails the API server's
    validation."""
    assert any(w.field == "spec.os"
               for w in pod_from_dict(manifest(os={"name": "linux"})).warnings)
    for name, expect in (("windows", "PodOSNotSupported"), ("plan9", "Unsupported value")):
        found = errors_of(manifest(os={"name": name}))
        assert any(expect in e for e in found), found


def test_pod_dns_fields() -> None:
    """hostname, subdomain, setHostnameAsFQDN, hostAliases and dnsConfig: validated as the API
    server, kept in the wire form (the sync loop applies them: syncloop/dns.py)."""
    dns = {"hostname": "web-0", "subdomain": "web", "setHostnameAsFQDN": True,
           "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["foo.local", "bar"]}],
           "dnsPolicy": "None",
           "dnsConfig": {"nameservers": ["10.96.0.10"], "searches": ["ns1.svc.example."],
                         "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}}
    parsed = pod_from_dict(manifest(**dns))
    assert parsed.warnings == ()
    spec = parsed.pod.to_dict()["spec"]
    assert {k: spec[k] for k in dns} == dns
    again = pod_from_dict(parsed.pod.to_dict()).pod
    assert again == parsed.pod and again.spec.dns.config is not None
    assert again.spec.dns.config.options[1].value is None
    errors = errors_of(manifest(hostname="Web_0", dnsPolicy="None",
                                hostAliases=[{"ip": "nope", "hostnames": ["x"]}]))
    assert any(e.startswith("spec.hostname:") for e in errors), errors
    assert any("spec.hostAliases[0].ip: Invalid value: 'nope'" in e for e in errors), errors
    assert any("spec.dnsConfig: Required value" in e for e in errors), errors
    errors = errors_of(manifest(dnsConfig={"nameservers": ["1.1.1.1", "1.0.0.1", "8.8.8.8",
                                                           "9.9.9.9"]}))
    assert any("must not have more than 3 nameservers" in e for e in errors), errors


def test_sub_path_expr_and_mount_propagation() -> None:
    """subPathExpr (expanded from the container's environment when it starts) and
    mountPropagation: validated as the API server, kept in the wire form, sent as the kubelet
    sends them (CRI propagation; the expanded path under the volume)."""
    from cri_api.v1 import api_pb2 as pb

    from podvisor.services.syncloop import cri_config

    mounts = [{"name": "v", "mountPath": "/a", "subPathExpr": "logs/$(POD)"},
              {"name": "v", "mountPath": "/b", "mountPropagation": "HostToContainer"},
              {"name": "v", "mountPath": "/c", "mountPropagation": "Bidirectional"}]
    doc = manifest(volumes=[{"name": "v", "emptyDir": {}}],
                   containers=[{"name": "c", "image": "host", "volumeMounts": mounts,
                                "securityContext": {"privileged": True}}])
    pod = pod_from_dict(doc).pod
    assert pod.to_dict()["spec"]["containers"][0]["volumeMounts"] == mounts
    assert pod_from_dict(pod.to_dict()).pod == pod
    c = pod.spec.containers[0]
    config = cri_config.container_config(pod, c, 0, {"v": cri_config.Path("/vol")},
                                         env=[("POD", "web-0")])
    assert [(m.host_path, m.propagation) for m in config.mounts] == [
        ("/vol/logs/web-0", pb.PROPAGATION_PRIVATE),
        ("/vol", pb.PROPAGATION_HOST_TO_CONTAINER), ("/vol", pb.PROPAGATION_BIDIRECTIONAL)]
    with pytest.raises(cri_config.SubPathError, match="missing value for POD"):
        cri_config.container_config(pod, c, 0, {"v": cri_config.Path("/vol")}, env=[])
    with pytest.raises(cri_config.SubPathError, match=r"must not contain '\.\.'"):
        cri_config.expand_sub_path("$(X)/a", {"X": ".."})
    unprivileged = manifest(volumes=[{"name": "v", "emptyDir": {}}],
                            containers=[{"name": "c", "image": "host", "volumeMounts": [
                                {"name": "v", "mountPath": "/c",
                                 "mountPropagation": "Bidirectional"},
                                {"name": "v", "mountPath": "/d", "subPath": "x",
                                 "subPathExpr": "y"}]}])
    errors = errors_of(unprivileged)
    assert any("Bidirectional mount propagation is available only to privileged containers"
               in e for e in errors), errors
    assert any("subPathExpr and subPath are mutually exclusive" in e for e in errors), errors


def test_host_ip() -> None:
    """``ports[].hostIP``: a valid address, kept, sent as the CRI port mapping's host_ip; two
    pods may take one host port on two addresses, not on one (or on every address)."""
    from podvisor.services.syncloop import cri_config
    from podvisor.services.syncloop.admission import _duplicate_ports, _port_conflicts

    def mapped(name: str, *ports: dict[str, Any]) -> Any:
        doc = manifest(containers=[{"name": "c", "image": "host", "ports": list(ports)}])
        doc["metadata"].update(name=name, uid=f"uid-{name}")
        return pod_from_dict(doc).pod

    a = mapped("a", {"containerPort": 80, "hostPort": 8080, "hostIP": "127.0.0.1"})
    assert a.to_dict()["spec"]["containers"][0]["ports"][0]["hostIP"] == "127.0.0.1"
    assert pod_from_dict(a.to_dict()).pod == a
    config = cri_config.sandbox_config(a, 0, cri_config.Path("/logs"))
    assert (config.port_mappings[0].host_ip, config.port_mappings[0].host_port) == (
        "127.0.0.1", 8080)
    b = mapped("b", {"containerPort": 80, "hostPort": 8080, "hostIP": "127.0.0.2"})
    every = mapped("e", {"containerPort": 80, "hostPort": 8080})
    assert _port_conflicts(b, [a]) == []
    assert _port_conflicts(every, [a]) == [f"8080/TCP (used by {a.full_name})"]
    assert _duplicate_ports(mapped("d", {"containerPort": 80, "hostPort": 8080},
                                   {"containerPort": 81, "hostPort": 8080,
                                    "hostIP": "127.0.0.1"})) == ["8080/TCP on 127.0.0.1"]
    bad = manifest(containers=[{"name": "c", "image": "host", "ports": [
        {"containerPort": 80, "hostIP": "localhost"}]}])
    assert any("hostIP: Invalid value: 'localhost'" in e for e in errors_of(bad))


def test_stdin_stdin_once_and_tty() -> None:
    from podvisor.services.syncloop import cri_config

    doc = manifest(containers=[{"name": "c", "image": "host", "stdin": True,
                                "stdinOnce": True, "tty": True}])
    parsed = pod_from_dict(doc)
    assert parsed.warnings == ()
    c = parsed.pod.spec.containers[0]
    assert (c.stdin, c.stdin_once, c.tty) == (True, True, True)
    assert pod_from_dict(parsed.pod.to_dict()).pod == parsed.pod
    config = cri_config.container_config(parsed.pod, c, 0, {})
    assert (config.stdin, config.stdin_once, config.tty) == (True, True, True)
    plain = pod_from_dict(manifest()).pod
    assert "stdin" not in plain.to_dict()["spec"]["containers"][0]
