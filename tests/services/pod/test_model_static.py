"""Static pod defaults (UID, name, annotations) and the container spec hash."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from podvisor.services.pod import (
    CONFIG_HASH_ANNOTATION,
    CONFIG_SEEN_ANNOTATION,
    CONFIG_SOURCE_ANNOTATION,
    Pod,
    PodValidationError,
    apply_static_defaults,
    container_hash,
    decode_pod,
    pod_from_dict,
    rfc3339,
)

YAML = b"""\
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: web
    image: host
    command: [sleep, "100"]
"""
# The same pod written differently: JSON, other key order, explicit defaults.
JSON = (b'{"kind":"Pod","apiVersion":"v1","spec":{"restartPolicy":"Always",'
        b'"terminationGracePeriodSeconds":30,"containers":[{"command":["sleep","100"],'
        b'"image":"host","name":"web","imagePullPolicy":"Always"}]},'
        b'"metadata":{"labels":{"app":"web"},"name":"web"}}')


def static(pod: Pod, node: str = "node-1", source: str = "file",
           location: str = "/etc/pods/web.yaml", seen: float = 0.0) -> Pod:
    return apply_static_defaults(pod, node_name=node, source=source, location=location,
                                 seen=rfc3339(seen))


def parse(data: bytes) -> Pod:
    return decode_pod(data, "web.yaml").pod


def test_static_defaults() -> None:
    pod = static(parse(YAML), node="Node-1")
    assert pod.name == "web-node-1"
    assert pod.namespace == "default"
    assert pod.spec.node_name == "Node-1"
    assert len(pod.uid) == 32 and int(pod.uid, 16) >= 0
    assert pod.metadata.annotations[CONFIG_HASH_ANNOTATION] == pod.uid
    assert pod.metadata.annotations[CONFIG_SOURCE_ANNOTATION] == "file"
    assert pod.metadata.annotations[CONFIG_SEEN_ANNOTATION] == "1970-01-01T00:00:00.000000Z"
    assert pod.status == {"phase": "Pending"}
    assert pod.origin is not None and pod.origin.location == "/etc/pods/web.yaml"
    assert pod.full_name == "web-node-1_default"


def test_uid_is_stable_across_formatting_and_time() -> None:
    a = static(parse(YAML), seen=1.0)
    b = static(parse(JSON), seen=99999.0)
    assert a.uid == b.uid
    # ... and across the wire.
    assert pod_from_dict(a.to_dict()).pod == a


@pytest.mark.parametrize("change", [
    {"node": "node-2"},
    {"location": "/etc/pods/other.yaml"},
    {"source": "http", "location": "http://h/pods"},
])
def test_uid_depends_on_node_and_location(change: dict[str, Any]) -> None:
    assert static(parse(YAML), **change).uid != static(parse(YAML)).uid


def test_uid_depends_on_content() -> None:
    edited = parse(YAML.replace(b'"100"', b'"200"'))
    assert static(edited).uid != static(parse(YAML)).uid


def test_manifest_uid_is_kept() -> None:
    pod = parse(YAML.replace(b"  name: web\n", b"  name: web\n  uid: fixed-uid\n"))
    assert static(pod).uid == "fixed-uid"


def test_existing_namespace_and_annotations_are_kept() -> None:
    pod = parse(YAML.replace(b"  name: web\n",
                             b"  name: web\n  namespace: kube-system\n  annotations: {a: b}\n"))
    out = static(pod)
    assert out.namespace == "kube-system" and out.metadata.annotations["a"] == "b"


def test_name_too_long_with_node() -> None:
    pod = parse(YAML.replace(b"name: web\n", b"name: " + b"w" * 250 + b"\n", 1))
    with pytest.raises(PodValidationError, match=r"metadata\.name: with the node name"):
        static(pod)


def test_container_hash_is_stable_and_sensitive() -> None:
    a = parse(YAML).spec.containers[0]
    b = parse(JSON).spec.containers[0]
    assert container_hash(a) == container_hash(b)
    assert len(container_hash(a)) == 16
    assert container_hash(replace(a, command=("sleep", "200"))) != container_hash(a)
    assert container_hash(replace(a, image="other")) != container_hash(a)
    # Pod-level changes do not touch the container's hash.
    assert container_hash(static(parse(YAML)).spec.containers[0]) == container_hash(a)


def test_container_hash_known_value() -> None:
    """The hash must not drift between releases: it is stored with running containers, and a
    drift would restart every container on upgrade."""
    assert container_hash(parse(YAML).spec.containers[0]) == "a97dfa6c6a022bd2"
