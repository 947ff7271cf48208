"""The volumes the volume manager mounts (issue 25) in the pod model: API pods may have
``persistentVolumeClaim``, ``ephemeral`` and inline ``csi`` volumes (validated as the API
server does; the wire form round-trips); static pods are refused them with the reason."""

from __future__ import annotations

from typing import Any

import pytest

from podvisor.services.pod import (
    ClaimVolume,
    CSIVolume,
    EphemeralVolume,
    PodValidationError,
    pod_from_dict,
    pod_from_wire,
)

TEMPLATE = {"spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}}}


def pod(*volumes: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": "host", "volumeMounts": [
                {"name": v["name"], "mountPath": f"/{v['name']}"} for v in volumes]}],
                "volumes": list(volumes)}}


def test_api_pods_take_claims_ephemeral_and_csi_volumes() -> None:
    parsed = pod_from_dict(pod(
        {"name": "d", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}},
        {"name": "e", "ephemeral": {"volumeClaimTemplate": TEMPLATE}},
        {"name": "i", "csi": {"driver": "csi.example.com", "fsType": "ext4",
                              "volumeAttributes": {"size": "1Mi"},
                              "nodePublishSecretRef": {"name": "s"}}}), api_objects=True)
    sources = [v.source for v in parsed.pod.spec.volumes]
    assert sources == [ClaimVolume("data", True), EphemeralVolume(TEMPLATE),
                       CSIVolume("csi.example.com", False, "ext4", {"size": "1Mi"}, "s")]
    assert all(v.mounted for v in parsed.pod.spec.volumes)
    wire = parsed.pod.to_dict()
    assert pod_from_wire(wire) == parsed.pod
    assert pod_from_dict(wire, api_objects=True).pod == parsed.pod


@pytest.mark.parametrize(("volume", "reason"), [
    ({"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
     "spec.volumes[0].persistentVolumeClaim: static pods may not reference API objects "
     "(PersistentVolumeClaim volume: as with the kubelet, the API server refuses the mirror "
     "pod of a static pod that references a claim)"),
    ({"name": "e", "ephemeral": {"volumeClaimTemplate": TEMPLATE}},
     "spec.volumes[0].ephemeral: static pods may not reference API objects (ephemeral "
     "volume: its claim is made by the API server's ephemeral-volume controller, for API "
     "pods only)"),
    ({"name": "i", "csi": {"driver": "csi.example.com"}},
     "spec.volumes[0].csi: static pods may not reference API objects (inline csi volume: it "
     "needs its driver's CSIDriver object)"),
])
def test_static_pods_may_not_reference_claims(volume: dict[str, Any], reason: str) -> None:
    with pytest.raises(PodValidationError) as err:
        pod_from_dict(pod(volume))
    assert reason in [str(e) for e in err.value.errors]


@pytest.mark.parametrize(("volume", "field", "reason"), [
    ({"name": "d", "persistentVolumeClaim": {}},
     "spec.volumes[0].persistentVolumeClaim.claimName", "Required value"),
    ({"name": "e", "ephemeral": {}}, "spec.volumes[0].ephemeral.volumeClaimTemplate",
     "Required value"),
    ({"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {"resources": {
        "requests": {"storage": "1Gi"}}}}}},
     "spec.volumes[0].ephemeral.volumeClaimTemplate.spec.accessModes",
     "Required value: at least 1 access mode is required"),
    ({"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {
        "accessModes": ["ReadWriteOnce"]}}}},
     "spec.volumes[0].ephemeral.volumeClaimTemplate.spec.resources[storage]",
     "Required value"),
    ({"name": "i", "csi": {}}, "spec.volumes[0].csi.driver", "Required value"),
])
def test_invalid_sources_are_refused_as_the_api_server_does(volume: dict[str, Any], field: str,
                                                            reason: str) -> None:
    with pytest.raises(PodValidationError) as err:
        pod_from_dict(pod(volume), api_objects=True)
    assert (field, reason) in [(e.field, e.reason) for e in err.value.errors]


def _block_pod(devices: list[dict[str, Any]], *volumes: dict[str, Any],
               mounts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    raw = pod(*volumes)
    raw["spec"]["containers"][0]["volumeMounts"] = mounts or []
    raw["spec"]["containers"][0]["volumeDevices"] = devices
    return raw


def test_volume_devices_of_claims_are_taken_and_round_trip() -> None:
    """Raw block volumes (issue 24): a claim's or an ephemeral volume's, as a device path."""
    parsed = pod_from_dict(_block_pod(
        [{"name": "d", "devicePath": "/dev/xvda"}, {"name": "e", "devicePath": "/dev/xvdb"}],
        {"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
        {"name": "e", "ephemeral": {"volumeClaimTemplate": TEMPLATE}}), api_objects=True).pod
    [c] = parsed.spec.containers
    assert [(d.name, d.device_path) for d in c.volume_devices] == [("d", "/dev/xvda"),
                                                                   ("e", "/dev/xvdb")]
    assert c.to_dict()["volumeDevices"] == [{"name": "d", "devicePath": "/dev/xvda"},
                                            {"name": "e", "devicePath": "/dev/xvdb"}]
    assert pod_from_wire(parsed.to_dict()) == parsed


CLAIM_D = {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}


@pytest.mark.parametrize(("devices", "volumes", "mounts", "field", "reason"), [
    ([{"name": "d"}], [CLAIM_D], None, "spec.containers[0].volumeDevices[0].devicePath",
     "required"),
    ([{"name": "x", "devicePath": "/dev/x"}], [CLAIM_D], None,
     "spec.containers[0].volumeDevices[0].name", "Not found: 'x'"),
    ([{"name": "h", "devicePath": "/dev/x"}], [{"name": "h", "hostPath": {"path": "/x"}}],
     None, "spec.containers[0].volumeDevices[0].name", "Invalid value: 'h': can only use "
     "volume source type of PersistentVolumeClaim or Ephemeral for block mode"),
    ([{"name": "d", "devicePath": "/dev/x"}, {"name": "d", "devicePath": "/dev/y"}],
     [CLAIM_D], None, "spec.containers[0].volumeDevices[1].name",
     "Invalid value: 'd': must be unique"),
    ([{"name": "d", "devicePath": "/dev/../x"}], [CLAIM_D], None,
     "spec.containers[0].volumeDevices[0].devicePath",
     "Invalid value: '/dev/../x': can not contain backsteps ('..')"),
    ([{"name": "d", "devicePath": "/dev/x"}], [CLAIM_D], [{"name": "d", "mountPath": "/m"}],
     "spec.containers[0].volumeDevices.name",
     "Invalid value: 'd': must not already exist in volumeMounts"),
])
def test_invalid_volume_devices_are_refused_as_the_api_server_does(
        devices: list[dict[str, Any]], volumes: list[dict[str, Any]],
        mounts: list[dict[str, Any]] | None, field: str, reason: str) -> None:
    with pytest.raises(PodValidationError) as err:
        pod_from_dict(_block_pod(devices, *volumes, mounts=mounts), api_objects=True)
    assert (field, reason) in [(e.field, e.reason) for e in err.value.errors]
