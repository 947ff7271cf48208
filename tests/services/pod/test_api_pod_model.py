"""API pods may reference API objects (configMap/secret/projected volumes, configMapKeyRef,
secretKeyRef, envFrom); static pods still may not; the wire form of an API pod parses again."""

from __future__ import annotations

from typing import Any

import pytest

from podvisor.services.pod import PodValidationError, pod_from_dict
from podvisor.services.pod.model import ApiVolume


def manifest() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns",
                                                            "uid": "u"},
            "spec": {"serviceAccountName": "builder", "volumes": [
                {"name": "cfg", "configMap": {"name": "app", "items": [
                    {"key": "k", "path": "dir/k", "mode": 0o600}]}},
                {"name": "sec", "secret": {"secretName": "s", "optional": True}},
                {"name": "acc", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt",
                                   "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                        "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
                "containers": [{"name": "c", "image": "i",
                                "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {
                                    "name": "app", "key": "k"}}}],
                                "envFrom": [{"prefix": "X_", "secretRef": {"name": "s"}}]}]}}


def test_api_pod_accepted_and_its_wire_form_parses_again() -> None:
    pod = pod_from_dict(manifest(), "api", api_objects=True).pod
    kinds = [v.source.kind for v in pod.spec.volumes if isinstance(v.source, ApiVolume)]
    assert kinds == ["configMap", "secret", "projected"]
    assert pod.spec.containers[0].env_from[0].prefix == "X_"
    assert pod.spec.service_account_name == "builder"
    wire = {**pod.to_dict(), "podvisor": {"source": "api", "location": "ns/p",
                                          "warnings": []}}
    assert pod_from_dict(wire).pod.spec == pod.spec


def test_static_pod_may_not_reference_api_objects() -> None:
    with pytest.raises(PodValidationError) as err:
        pod_from_dict(manifest(), "file.yaml")
    fields = {e.field for e in err.value.errors}
    assert "spec.volumes[0].configMap" in fields
    assert "spec.containers[0].envFrom" in fields
    assert "spec.serviceAccountName" in fields


def test_api_volume_validation() -> None:
    bad = manifest()
    bad["spec"]["volumes"][0]["configMap"]["items"][0]["path"] = "../escape"
    bad["spec"]["volumes"][2]["projected"]["sources"][0]["serviceAccountToken"][
        "expirationSeconds"] = 60
    with pytest.raises(PodValidationError) as err:
        pod_from_dict(bad, "api", api_objects=True)
    reasons = " ".join(e.reason for e in err.value.errors)
    assert "without '..'" in reasons and "less than 10 minutes" in reasons
