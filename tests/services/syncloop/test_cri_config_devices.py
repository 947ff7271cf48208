"""Raw block volumes in the container config (the kubelet's ``makeBlockVolumes`` and
``makeDevices``): each of a container's ``volumeDevices`` becomes a CRI device whose host path
is the volume manager's pod device map path, ``mrw`` (``r`` for a read-only claim); a device
whose volume is not mapped is a KeyError (the caller's CreateContainerError)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.pod import pod_from_dict
from podvisor.services.syncloop.cri_config import container_config

MAP = "/var/lib/podvisor/pods/u1/volumeDevices/kubernetes.io~local-volume"


def _pod() -> object:
    return pod_from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "p", "namespace": "default", "uid": "u1"}, "spec": {
        "volumes": [{"name": "a", "persistentVolumeClaim": {"claimName": "a"}},
                    {"name": "b", "persistentVolumeClaim": {"claimName": "b",
                                                            "readOnly": True}}],
        "containers": [{"name": "c", "image": "host", "volumeDevices": [
            {"name": "a", "devicePath": "/dev/xvda"},
            {"name": "b", "devicePath": "/dev/xvdb"}]}]}}, api_objects=True).pod


def test_volume_devices_become_cri_devices() -> None:
    pod = _pod()
    [c] = pod.spec.containers  # type: ignore[attr-defined]
    config = container_config(pod, c, 0, {}, block={  # type: ignore[arg-type]
        "a": (f"{MAP}/pv-a", False), "b": (f"{MAP}/pv-b", True)})
    assert list(config.devices) == [
        pb.Device(container_path="/dev/xvda", host_path=f"{MAP}/pv-a", permissions="mrw"),
        pb.Device(container_path="/dev/xvdb", host_path=f"{MAP}/pv-b", permissions="r")]
    assert not config.mounts  # a device, not a mount
    with pytest.raises(KeyError):
        container_config(pod, c, 0, {}, Path("/"),  # type: ignore[arg-type]
                         block={"a": (f"{MAP}/pv-a", False)})
