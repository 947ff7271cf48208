"""The desired state of the world, as values: which pod wants which volume, resolved through
its claim and PersistentVolume (``resolve.py``), and where each lands on the node.

Paths are the kubelet's: a pod's volume at ``<rootDir>/pods/<uid>/volumes/<plugin>/<name>``
(``<plugin>`` is ``kubernetes.io~csi`` or ``kubernetes.io~local-volume``; ``<name>`` the PV's
name for a claim, the pod's volume name for an inline volume), a CSI volume's target path
``.../mount`` beside its ``vol_data.json``, a CSI volume's staging path
``<rootDir>/plugins/kubernetes.io/csi/<driver>/<sha256(volumeHandle)>/globalmount``.
hostPath PersistentVolumes are not mounted: the containers bind the PV's path.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from podvisor.services.pod import PluginVolume
from podvisor.services.volumes.apitypes import CSISource


class Plugin(StrEnum):
    HOST_PATH = "kubernetes.io/host-path"
    LOCAL = "kubernetes.io/local-volume"
    CSI = "kubernetes.io/csi"
    NFS = "kubernetes.io/nfs"  # [issue 24] the volume plugins mounted by command
    ISCSI = "kubernetes.io/iscsi"
    FC = "kubernetes.io/fc"
    FLEX = "kubernetes.io/flexvolume"  # its folder: the driver's (``vendor~driver``)

    @property
    def folder(self) -> str:
        """The plugin's folder under a pod's ``volumes`` (``kubernetes.io~csi``)."""
        return self.value.replace("/", "~")


NET_PLUGINS = (Plugin.NFS, Plugin.ISCSI, Plugin.FC)


@dataclass(frozen=True)
class CsiVolume:
    """What a CSI node call needs of a volume (PV or inline)."""

    source: CSISource
    access_mode: str = "ReadWriteOnce"  # the PV's first access mode
    ephemeral: bool = False  # an inline csi volume (lifecycle mode Ephemeral)
    attach: bool = False  # the CSIDriver requires attach (a VolumeAttachment)
    pod_info: bool = False  # CSIDriver.podInfoOnMount
    fs_group_policy: str = "ReadWriteOnceWithFSType"


@dataclass(frozen=True)
class VolumeSpec:
    """One volume of one pod, resolved. ``volume``: the pod's volume name; ``spec_name``: the
    PV's name (a claim) or ``volume`` (inline); ``unique_name``: the kubelet's unique volume
    name (one device per unique name: two pods of one claim share its staging)."""

    pod_uid: str
    pod_name: str
    pod_namespace: str
    volume: str
    spec_name: str
    plugin: Plugin
    unique_name: str
    read_only: bool = False
    claim: str = ""
    path: str = ""  # hostPath / local: the PV's path
    csi: CsiVolume | None = None
    fs_group: int | None = None
    on_root_mismatch: bool = False
    service_account: str = ""
    source: PluginVolume | None = None  # nfs, iscsi, fc, flexVolume: the volume's source
    driver: str = ""  # flexVolume: ``vendor/driver``
    mount_options: tuple[str, ...] = ()  # the PV's mountOptions
    secret: tuple[str, str] | None = None  # iscsi/flexVolume secretRef (namespace, name)

    @property
    def attachable(self) -> bool:
        return self.csi is not None and self.csi.attach

    @property
    def device_mountable(self) -> bool:
        """Staged once per node (NodeStageVolume), before the pods' publishes."""
        return self.csi is not None and not self.csi.ephemeral


@dataclass(frozen=True)
class Failure:
    """A volume of a pod that cannot be resolved now (claim missing, unbound, ...)."""

    volume: str
    message: str


@dataclass(frozen=True)
class PodWants:
    """A pod's resolved volumes (``specs``) and the ones that failed (``failures``)."""

    uid: str
    name: str
    namespace: str
    specs: tuple[VolumeSpec, ...] = ()
    failures: tuple[Failure, ...] = field(default_factory=tuple)


def volume_handle(pod_uid: str, volume: str) -> str:
    """An inline csi volume's handle, as the kubelet makes it."""
    return "csi-" + hashlib.sha256((pod_uid + volume).encode()).hexdigest()


@dataclass(frozen=True)
class VolumePaths:
    """Where volumes go under ``rootDir``."""

    root: Path

    @property
    def pods(self) -> Path:
        return self.root / "pods"

    @property
    def registry(self) -> Path:
        """The plugin-registration socket folder (the kubelet's ``plugins_registry``)."""
        return self.root / "plugins_registry"

    def pod_volume(self, pod_uid: str, plugin: Plugin, spec_name: str, driver: str = "") -> Path:
        folder = driver.replace("/", "~") if plugin is Plugin.FLEX else plugin.folder
        return self.pods / pod_uid / "volumes" / folder / spec_name

    def target(self, spec: VolumeSpec) -> Path:
        """What the containers bind: a CSI volume's ``mount`` folder, a local volume's
        folder, a hostPath PV's path."""
        if spec.plugin is Plugin.HOST_PATH:
            return Path(spec.path)
        base = self.pod_volume(spec.pod_uid, spec.plugin, spec.spec_name, spec.driver)
        return base / "mount" if spec.plugin is Plugin.CSI else base

    def staging(self, driver: str, handle: str) -> Path:
        digest = hashlib.sha256(handle.encode()).hexdigest()
        return self.root / "plugins" / "kubernetes.io" / "csi" / driver / digest / "globalmount"

    @property
    def iscsi_disks(self) -> Path:
        """Where an iscsi volume keeps what its logout needs (``<pod uid>~<volume>.json``)."""
        return self.root / "plugins" / "kubernetes.io" / "iscsi"

    def flex_device_mount(self, driver: str, volume: str) -> Path:
        """A FlexVolume's device mount path (the kubelet's default SetUpAt binds it)."""
        return self.root / "plugins" / "kubernetes.io" / "flexvolume" / driver / "mounts" / volume
