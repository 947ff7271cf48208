"""The actual state rebuilt from what exists on the node after a (re)start (the kubelet's
volume reconstruction): every record found is ``UNCERTAIN``, so a volume a pod still wants is
staged and published again (the CSI calls are idempotent) and one no pod wants is torn down.

Found: each pod's nfs, iscsi and fc volume folders (``kubernetes.io~nfs/<name>``, ...) and
those of the FlexVolume drivers probed (``<vendor~driver>/<name>``: a driver gone leaves its
folders alone); each pod's CSI volume folders with their ``vol_data.json``
(``pods/<uid>/volumes/kubernetes.io~csi/<name>/``), each pod's local volume folders
(``.../kubernetes.io~local-volume/<pv>``, mounted or not), and each CSI device's folder with
its ``vol_data.json`` (``plugins/kubernetes.io/csi/<driver>/<digest>/``: staged, or attached
by podvisor when it names an ``attachmentID``: its VolumeAttachment is asked again, or
deleted). A folder without a readable ``vol_data.json``
is logged and left alone (never guessed at).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from podvisor.services.volumes.operations import VOL_DATA
from podvisor.services.volumes.spec import NET_PLUGINS, Plugin, VolumePaths
from podvisor.services.volumes.state import (
    ActualState,
    Device,
    DeviceRecord,
    Mounted,
    MountKey,
    MountRecord,
)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _children(path: Path) -> list[Path]:
    try:
        return sorted(p for p in path.iterdir() if p.is_dir())
    except OSError:
        return []


def reconstruct(paths: VolumePaths,
                log: Callable[..., None] = lambda event, **fields: None,
                flex: Mapping[str, str] | None = None) -> ActualState:
    """``flex``: the FlexVolume drivers probed, folder (``vendor~driver``) -> driver name."""
    actual = ActualState()
    for pod in _children(paths.pods):
        volumes = pod / "volumes"
        for plugin in NET_PLUGINS:  # [issue 24] mounted or not: uncertain
            for folder in _children(volumes / plugin.folder):
                key = MountKey(pod.name, plugin, folder.name)
                actual.mounts[key] = MountRecord(
                    key, Device(f"{plugin}/{pod.name}-{folder.name}"), Mounted.UNCERTAIN)
        for driver_folder, driver in sorted((flex or {}).items()):
            for folder in _children(volumes / driver_folder):
                key = MountKey(pod.name, Plugin.FLEX, folder.name, driver)
                actual.mounts[key] = MountRecord(
                    key, Device(f"flexvolume-{driver}/{pod.name}-{folder.name}"),
                    Mounted.UNCERTAIN)
        for folder in _children(volumes / Plugin.LOCAL.folder):
            key = MountKey(pod.name, Plugin.LOCAL, folder.name)  # mounted or not: uncertain
            actual.mounts[key] = MountRecord(key, Device(f"{Plugin.LOCAL}/{folder.name}"),
                                             Mounted.UNCERTAIN)
        for folder in _children(volumes / Plugin.CSI.folder):
            data = _read(folder / VOL_DATA)
            if data is None:
                log("volumes.reconstruct.skipped", path=str(folder),
                    reason=f"no readable {VOL_DATA}")
                continue
            driver, handle = str(data.get("driverName", "")), str(data.get("volumeHandle", ""))
            ephemeral = data.get("volumeLifecycleMode") == "Ephemeral"
            unique = (f"{Plugin.CSI}/{pod.name}-{folder.name}" if ephemeral
                      else f"{Plugin.CSI}/{driver}^{handle}")
            key = MountKey(pod.name, Plugin.CSI, folder.name)
            actual.mounts[key] = MountRecord(key, Device(unique, driver, handle),
                                             Mounted.UNCERTAIN)
    csi_root = paths.root / "plugins" / "kubernetes.io" / "csi"
    for driver_dir in _children(csi_root):
        for folder in _children(driver_dir):
            data = _read(folder / VOL_DATA)
            if data is None:
                log("volumes.reconstruct.skipped", path=str(folder),
                    reason=f"no readable {VOL_DATA}")
                continue
            driver, handle = str(data.get("driverName", "")), str(data.get("volumeHandle", ""))
            attach_id = str(data.get("attachmentID", ""))
            unique = f"{Plugin.CSI}/{driver}^{handle}"
            staged = (folder / "globalmount").exists()
            actual.devices[unique] = DeviceRecord(
                Device(unique, driver, handle, attach_id), attached=False,  # asked again
                staged=Mounted.UNCERTAIN if staged else Mounted.NO)
    log("volumes.reconstructed", mounts=len(actual.mounts), devices=len(actual.devices))
    return actual
