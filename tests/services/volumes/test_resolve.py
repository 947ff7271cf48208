"""The desired state's populator (``resolve.Resolver``) against a fake API: claims, PVs and
CSIDrivers resolved into volume specs, and every refusal with the kubelet's message."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from podvisor.services.pod import Pod, pod_from_dict
from podvisor.services.volumes.resolve import Resolver
from podvisor.services.volumes.spec import Plugin

NODE = "n1"
PVC = "/api/v1/namespaces/default/persistentvolumeclaims"


class FakeApi:
    def __init__(self, objects: Mapping[str, Any]) -> None:
        self.objects = dict(objects)

    def get(self, path: str) -> Mapping[str, Any] | None:
        return self.objects.get(path)


def pod(volume: dict[str, Any], **spec: Any) -> Pod:
    return pod_from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "web-0", "namespace": "default", "uid": "pod-uid"}, "spec": {
        "containers": [{"name": "c", "image": "host"}], "volumes": [volume], **spec}},
        api_objects=True).pod


def bound_claim(name: str = "data", pv: str = "pv1", uid: str = "claim-uid",
                **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "uid": uid, **meta},
            "spec": {"volumeName": pv}, "status": {"phase": "Bound"}}


def pv(source: dict[str, Any], name: str = "pv1", claim_uid: str = "claim-uid",
       **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        **source, "accessModes": ["ReadWriteOnce"],
        **({"claimRef": {"uid": claim_uid}} if claim_uid else {}), **spec}}


CLAIM = {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}


def resolve(objects: Mapping[str, Any], volume: dict[str, Any] = CLAIM, **spec: Any) -> Any:
    return Resolver(FakeApi(objects), NODE).pod(pod(volume, **spec))


def test_a_claim_on_a_host_path_pv() -> None:
    wants = resolve({f"{PVC}/data": bound_claim(),
                     "/api/v1/persistentvolumes/pv1": pv({"hostPath": {"path": "/srv/d"}})},
                    securityContext={"fsGroup": 7})
    [spec] = wants.specs
    assert (spec.plugin, spec.path, spec.claim, spec.fs_group) == (Plugin.HOST_PATH, "/srv/d",
                                                                   "data", 7)
    assert spec.unique_name == "kubernetes.io/host-path/pod-uid-pv1"


def test_a_csi_pv_takes_its_driver_settings() -> None:
    wants = resolve({
        f"{PVC}/data": bound_claim(),
        "/api/v1/persistentvolumes/pv1": pv({"csi": {"driver": "d", "volumeHandle": "h",
                                                     "readOnly": True}}),
        "/apis/storage.k8s.io/v1/csidrivers/d": {"spec": {"attachRequired": False,
                                                          "fsGroupPolicy": "File"}}})
    [spec] = wants.specs
    assert spec.unique_name == "kubernetes.io/csi/d^h" and spec.read_only
    assert spec.csi is not None and not spec.csi.attach and spec.csi.fs_group_policy == "File"
    assert spec.device_mountable and not spec.attachable


def test_a_csi_pv_without_a_csidriver_needs_attach() -> None:
    wants = resolve({f"{PVC}/data": bound_claim(), "/api/v1/persistentvolumes/pv1": pv(
        {"csi": {"driver": "d", "volumeHandle": "h"}})})
    assert wants.specs[0].attachable


@pytest.mark.parametrize(("objects", "message"), [
    ({}, 'error processing PVC default/data: persistentvolumeclaim "data" not found'),
    ({f"{PVC}/data": {**bound_claim(), "status": {"phase": "Pending"}}},
     "PVC is not bound"),
    ({f"{PVC}/data": bound_claim(deletionTimestamp="2026-01-01T00:00:00Z")},
     "can't start pod because PVC is being deleted"),
    ({f"{PVC}/data": bound_claim()}, 'persistentvolume "pv1" not found'),
    ({f"{PVC}/data": bound_claim(), "/api/v1/persistentvolumes/pv1": pv(
        {"hostPath": {"path": "/x"}}, claim_uid="")}, "has a nil pv.Spec.ClaimRef"),
    ({f"{PVC}/data": bound_claim(), "/api/v1/persistentvolumes/pv1": pv(
        {"hostPath": {"path": "/x"}}, claim_uid="other")}, 'does not point to claim.UID'),
    ({f"{PVC}/data": bound_claim(), "/api/v1/persistentvolumes/pv1": pv(
        {"rbd": {"monitors": ["m"], "image": "i"}})}, "its rbd source is not supported"),
    ({f"{PVC}/data": bound_claim(), "/api/v1/nodes/n1": {"metadata": {"labels": {
        "kubernetes.io/hostname": "n2"}}}, "/api/v1/persistentvolumes/pv1": pv(
        {"local": {"path": "/x"}}, nodeAffinity={"required": {"nodeSelectorTerms": [{
            "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                  "values": ["n1"]}]}]}})},
     'local PersistentVolume "pv1" is not on this node'),
])
def test_refusals_say_why(objects: Mapping[str, Any], message: str) -> None:
    wants = resolve(objects)
    assert not wants.specs
    assert message in wants.failures[0].message


def test_a_local_pv_whose_affinity_matches() -> None:
    wants = resolve({f"{PVC}/data": bound_claim(), "/api/v1/nodes/n1": {"metadata": {
        "labels": {"kubernetes.io/hostname": "n1"}}}, "/api/v1/persistentvolumes/pv1": pv(
        {"local": {"path": "/x"}}, nodeAffinity={"required": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n9"]}]},
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                   "values": ["n1"]}]}]}})})
    assert wants.specs[0].plugin is Plugin.LOCAL


EPHEMERAL = {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
    "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}}


def test_an_ephemeral_claim_must_be_the_pods() -> None:
    owner = [{"uid": "pod-uid", "kind": "Pod", "name": "web-0", "controller": True}]
    objects = {"/api/v1/persistentvolumes/pv1": pv({"hostPath": {"path": "/x"}})}
    ours = resolve({**objects, f"{PVC}/web-0-scratch": bound_claim(
        "web-0-scratch", ownerReferences=owner)}, EPHEMERAL)
    assert ours.specs[0].claim == "web-0-scratch"
    other = resolve({**objects, f"{PVC}/web-0-scratch": bound_claim("web-0-scratch")},
                    EPHEMERAL)
    assert other.failures[0].message == ("PVC default/web-0-scratch was not created for pod "
                                         "default/web-0 (pod is not owner)")


def test_an_inline_csi_volume_needs_the_ephemeral_mode() -> None:
    inline = {"name": "i", "csi": {"driver": "d"}}
    driver = "/apis/storage.k8s.io/v1/csidrivers/d"
    assert "not found" in resolve({}, inline).failures[0].message
    assert 'volume mode "Ephemeral" not supported by driver d' in resolve(
        {driver: {"spec": {}}}, inline).failures[0].message
    [spec] = resolve({driver: {"spec": {"volumeLifecycleModes": ["Ephemeral"]}}},
                     inline).specs
    assert spec.csi is not None and spec.csi.ephemeral and not spec.device_mountable
    assert spec.csi.source.handle.startswith("csi-") and spec.unique_name == \
        "kubernetes.io/csi/pod-uid-i"


def test_plugin_pvs_and_inline_plugin_volumes() -> None:
    """[issue 24] nfs/iscsi/fc/flexVolume: a PV's source with its mountOptions and the claim's
    readOnly, its secretRef's namespace; an inline one needs no API object at all."""
    from podvisor.services.pod import FlexVolume, NFSVolume
    claim = {"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}}
    wants = resolve({f"{PVC}/data": bound_claim(), "/api/v1/persistentvolumes/pv1": pv(
        {"nfs": {"server": "s", "path": "/e"}}, mountOptions=["hard", "nfsvers=4.1"])}, claim)
    [spec] = wants.specs
    assert (spec.plugin, spec.source, spec.mount_options, spec.read_only, spec.claim) == (
        Plugin.NFS, NFSVolume("s", "/e"), ("hard", "nfsvers=4.1"), True, "data")
    assert spec.unique_name == "kubernetes.io/nfs/pod-uid-pv1"
    wants = resolve({f"{PVC}/data": bound_claim(), "/api/v1/persistentvolumes/pv1": pv(
        {"flexVolume": {"driver": "v/d", "secretRef": {"name": "s", "namespace": "o"}}})})
    [spec] = wants.specs
    assert (spec.plugin, spec.driver, spec.secret) == (Plugin.FLEX, "v/d", ("o", "s"))
    inline = Resolver(None, NODE).pod(pod({"name": "x", "flexVolume": {
        "driver": "v/d", "readOnly": True, "secretRef": {"name": "s"}}}))
    [spec] = inline.specs
    assert spec.source == FlexVolume("v/d", read_only=True, secret_ref="s")
    assert (spec.read_only, spec.secret, spec.unique_name) == (
        True, ("default", "s"), "flexvolume-v/d/pod-uid-x")
    [failure] = Resolver(None, NODE).pod(pod(CLAIM)).failures
    assert "no API server" in failure.message
