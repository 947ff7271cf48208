"""The ``volumes`` map's values: wire round trip, kinds told apart, malformed ones refused."""

from __future__ import annotations

import pytest

from podvisor.ipc.maps import VOLUMES, MapValueError
from podvisor.ipc.volumemaps import (
    AttachedVolume,
    MountedVolume,
    NodeVolumes,
    PodVolumes,
    VolumeStats,
)


def test_values_round_trip() -> None:
    pod = PodVolumes("web-0", "default", {
        "data": MountedVolume("data", True, "/srv/d", False, "kubernetes.io/csi/d^h", "c",
                              stats=VolumeStats(1.5, 10, 100, 90, 5, 4, 1)),
        "other": MountedVolume("other", reason="FailedMount", message="not bound")})
    node = NodeVolumes(True, ("kubernetes.io/csi/d^h",), (AttachedVolume("kubernetes.io/csi/d^h"),))
    for value in (pod, node):
        assert VOLUMES.decode(VOLUMES.encode(value)) == value
    assert not pod.ready and PodVolumes("a", "b", {}).ready


@pytest.mark.parametrize("raw", [
    {"v": 2, "kind": "pod"}, {"v": 1, "kind": "other"}, {"v": 1, "kind": "pod", "volumes": 3},
    {"v": 1, "kind": "node", "in_use": [1]}, "x"])
def test_malformed_values_are_refused(raw: object) -> None:
    with pytest.raises(MapValueError):
        VOLUMES.decode(raw)
