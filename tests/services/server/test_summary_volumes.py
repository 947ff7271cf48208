"""``/stats/summary``'s ``volume`` entries (issue 25): a pod's mounted volumes from the volume
manager's map, in the kubelet's ``VolumeStats`` shape, ``pvcRef`` for a claim's."""

from __future__ import annotations

from podvisor.ipc.volumemaps import MountedVolume, PodVolumes, VolumeStats
from podvisor.services.server.summary import volume_entries


def test_volume_entries() -> None:
    pod = PodVolumes("web-0", "shop", {
        "data": MountedVolume("data", True, "/x", claim="data-web-0",
                              stats=VolumeStats(1_700_000_000.0, 10, 100, 90, 50, 40, 10)),
        "scratch": MountedVolume("scratch", True, "/y",
                                 stats=VolumeStats(1_700_000_000.0, 1, 2, 1, 3, 2, 1)),
        "waiting": MountedVolume("waiting", message="not bound")})
    assert volume_entries(pod) == [
        {"time": "2023-11-14T22:13:20Z", "availableBytes": 90, "capacityBytes": 100,
         "usedBytes": 10, "inodesFree": 40, "inodes": 50, "inodesUsed": 10, "name": "data",
         "pvcRef": {"name": "data-web-0", "namespace": "shop"}},
        {"time": "2023-11-14T22:13:20Z", "availableBytes": 1, "capacityBytes": 2,
         "usedBytes": 1, "inodesFree": 2, "inodes": 3, "inodesUsed": 1, "name": "scratch"}]
