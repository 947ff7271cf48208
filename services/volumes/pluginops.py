"""SetUp and TearDown of the volume plugins' volumes (issue 24): nfs, iscsi and fc by command
(``netplugins.py``), flexVolume by its driver (``flexvolume.py``), each at the pod's volume
folder ``pods/<uid>/volumes/<plugin or vendor~driver>/<name>``. Raises ``PluginFailed`` with
the kubelet's operation name and message (``MountVolume.SetUp``, ``MountVolume.WaitForAttach``
for an iscsi or fc disk that cannot be found, ``UnmountVolume.TearDown``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from podvisor.common.ownership import set_volume_ownership
from podvisor.services.pod import FCVolume, FlexVolume, ISCSIVolume, NFSVolume
from podvisor.services.volumes import netplugins
from podvisor.services.volumes.flexvolume import FlexDrivers, FlexError, options_for_driver
from podvisor.services.volumes.hostexec import Runner, RunnerError, unmount
from podvisor.services.volumes.mounter import Mounter, is_mount_point
from podvisor.services.volumes.spec import Plugin, VolumePaths, VolumeSpec
from podvisor.services.volumes.state import MountKey

__all__ = ["PluginFailed", "PluginMounts"]


class PluginFailed(Exception):
    """``op``: the kubelet's operation name; ``uncertain``: it may have mounted."""

    def __init__(self, op: str, message: str, uncertain: bool = False) -> None:
        super().__init__(message)
        self.op = op
        self.message = message
        self.uncertain = uncertain


SET_UP = "MountVolume.SetUp"
WAIT_FOR_ATTACH = "MountVolume.WaitForAttach"
TEAR_DOWN = "UnmountVolume.TearDown"


class PluginMounts:
    def __init__(self, paths: VolumePaths, mounter: Mounter, runner: Runner, flex: FlexDrivers,
                 devices: netplugins.Devices,
                 log: Callable[..., None] = lambda event, **fields: None) -> None:
        self.paths = paths
        self.mounter = mounter
        self.runner = runner
        self.flex = flex
        self.devices = devices
        self.log = log

    # -- set up --------------------------------------------------------------------------------
    def setup(self, spec: VolumeSpec, folder: Path, secret: Mapping[str, bytes]) -> None:
        """Mount ``spec`` at ``folder`` (made 0750; already a mount point: nothing to do)."""
        folder.mkdir(mode=0o750, parents=True, exist_ok=True)
        if is_mount_point(self.mounter, str(folder)):
            return
        source = spec.source
        try:
            if isinstance(source, FlexVolume):
                self._flex_setup(spec, source, folder, secret)
            elif isinstance(source, NFSVolume):
                netplugins.nfs_setup(self.runner, source, str(folder), spec.read_only,
                                     spec.mount_options)
            elif isinstance(source, ISCSIVolume | FCVolume):
                self._disk_setup(spec, source, folder, secret)
            else:
                raise PluginFailed(SET_UP, f"volume {spec.volume!r} has no plugin source")
        except (PluginFailed, RunnerError, FlexError, OSError) as err:
            uncertain = isinstance(err, PluginFailed | FlexError) and err.uncertain
            if not uncertain and not is_mount_point(self.mounter, str(folder)):
                with contextlib.suppress(OSError):
                    folder.rmdir()  # the kubelet removes the folder of a failed SetUp
            if isinstance(err, PluginFailed):
                raise
            raise PluginFailed(SET_UP, str(err), uncertain) from None
        self._fs_group(spec, folder)

    def _fs_group(self, spec: VolumeSpec, folder: Path) -> None:
        """The pod's fsGroup on the volume: iscsi and fc disks, and a FlexVolume whose driver
        has the ``fsGroup`` capability; never read-only ones, never nfs (as the kubelet)."""
        if spec.fs_group is None or spec.read_only or spec.plugin is Plugin.NFS:
            return
        if spec.plugin is Plugin.FLEX and not self.flex.get(spec.driver).capabilities.fs_group:
            return
        try:
            set_volume_ownership(folder, spec.fs_group, spec.on_root_mismatch)
        except OSError as err:
            raise PluginFailed(SET_UP, f"applying fsGroup: {err}") from None

    def _flex_setup(self, spec: VolumeSpec, source: FlexVolume, folder: Path,
                    secret: Mapping[str, bytes]) -> None:
        try:
            driver = self.flex.get(source.driver)
        except KeyError:
            raise PluginFailed(SET_UP, f'failed to get Plugin from volumeSpec for volume '
                                       f'"{spec.volume}" err=no volume plugin matched: no '
                                       f'FlexVolume driver "{source.driver}" in '
                                       f"{self.flex.plugin_dir}") from None
        if driver.capabilities.attach:
            raise PluginFailed(SET_UP, f"FlexVolume driver {source.driver} attaches "
                                       "(its init answered no capabilities.attach false): "
                                       "podvisor mounts non-attachable drivers only")
        options = options_for_driver(
            fs_type=source.fs_type, read_only=spec.read_only, spec_name=spec.spec_name,
            pod={"pod.name": spec.pod_name, "pod.namespace": spec.pod_namespace,
                 "pod.uid": spec.pod_uid, "serviceAccount.name": spec.service_account},
            fs_group=spec.fs_group, secrets=secret, options=source.options)
        try:
            self.flex.call(driver, "mount", str(folder), options)
        except FlexError as err:
            if not err.not_supported:
                raise
            device = self.paths.flex_device_mount(source.driver, spec.spec_name)
            self.mounter.bind(str(device), str(folder), spec.read_only)  # the default SetUpAt
        self.log("volumes.flexvolume.mounted", driver=source.driver, pod_uid=spec.pod_uid,
                 volume=spec.volume, target_path=str(folder))

    def _disk_setup(self, spec: VolumeSpec, source: ISCSIVolume | FCVolume, folder: Path,
                    secret: Mapping[str, bytes]) -> None:
        try:
            if isinstance(source, ISCSIVolume):
                text = {k: v.decode(errors="replace") for k, v in secret.items()}
                device, disk = netplugins.iscsi_setup(self.runner, self.devices, source,
                                                      spec.spec_name, text)
                self.paths.iscsi_disks.mkdir(parents=True, exist_ok=True)
                self._iscsi_file(spec.pod_uid, spec.spec_name).write_text(disk.to_json())
            else:
                device = netplugins.fc_setup(self.devices, source)
        except RunnerError as err:
            raise PluginFailed(WAIT_FOR_ATTACH, str(err)) from None
        netplugins.format_and_mount(self.runner, device, str(folder), source.fs_type,
                                    spec.read_only, spec.mount_options)

    def _iscsi_file(self, pod_uid: str, spec_name: str) -> Path:
        return self.paths.iscsi_disks / f"{pod_uid}~{spec_name}.json"

    # -- tear down -----------------------------------------------------------------------------
    def teardown(self, key: MountKey, folder: Path) -> None:
        try:
            if key.plugin is Plugin.FLEX:
                self._flex_teardown(key, folder)
            else:
                while is_mount_point(self.mounter, str(folder)):
                    unmount(self.runner, str(folder))
            if folder.exists():
                folder.rmdir()
        except (RunnerError, FlexError, OSError) as err:
            raise PluginFailed(TEAR_DOWN, str(err)) from None
        if key.plugin is Plugin.ISCSI:
            self._iscsi_release(key)

    def _flex_teardown(self, key: MountKey, folder: Path) -> None:
        if not os.path.lexists(folder):
            return
        try:
            driver = self.flex.get(key.driver)
        except KeyError:
            raise FlexError(f'no FlexVolume driver "{key.driver}" in '
                            f"{self.flex.plugin_dir} to unmount it") from None
        try:
            self.flex.call(driver, "unmount", str(folder))
        except FlexError as err:
            if not err.not_supported:
                raise
            while is_mount_point(self.mounter, str(folder)):
                self.mounter.unmount(str(folder))
        self.log("volumes.flexvolume.unmounted", driver=key.driver, pod_uid=key.pod_uid,
                 volume=key.spec_name, target_path=str(folder))

    def _iscsi_release(self, key: MountKey) -> None:
        """Log out of the target once no other pod's iscsi volume uses it."""
        path = self._iscsi_file(key.pod_uid, key.spec_name)
        try:
            disk = netplugins.IscsiDisk.from_json(path.read_text())
        except (OSError, ValueError, KeyError):
            return  # not logged in by podvisor (or already out)
        path.unlink(missing_ok=True)
        for other in self.paths.iscsi_disks.glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                seen = netplugins.IscsiDisk.from_json(other.read_text())
                if seen.iqn == disk.iqn and set(seen.portals) & set(disk.portals):
                    return
        netplugins.iscsi_logout(self.runner, disk)
