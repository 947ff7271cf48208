"""The reconciler's operations, carried out (the kubelet's operation generator): attach,
stage, mount and their inverses, per plugin. Each updates the actual state and raises
``OpFailed`` (with the kubelet's event reason and message) when it did not finish.

- hostPath PV: nothing to mount (the containers bind the PV's path); ``mount`` records it.
- local PV: the PV's directory bound into ``pods/<uid>/volumes/kubernetes.io~local-volume/
  <pv>`` (read-only when asked), then ``fsGroup`` applied (not read-only).
- CSI: ``attach`` (only when the CSIDriver requires it): a VolumeAttachment
  ``csi-<sha256(handle + driver + node)>`` made by podvisor (which acts as the kubelet with
  ``enableControllerAttachDetach: false``), waited for until its ``status.attached``.
  ``stage``: ``vol_data.json`` written beside the staging path before the folder is made and
  ``NodeStageVolume`` is called (so a crash after it is found by the reconstruction), only
  when the plugin offers ``STAGE_UNSTAGE_VOLUME``. ``mount``: ``vol_data.json`` in the pod's
  volume folder, then ``NodePublishVolume`` at ``<folder>/mount`` (the plugin makes it), then
  ``fsGroup`` per the CSIDriver's ``fsGroupPolicy`` (or passed to the plugin as
  ``volume_mount_group`` when it offers ``VOLUME_MOUNT_GROUP``). ``unmount``:
  ``NodeUnpublishVolume``, then the folder and its ``vol_data.json`` go; ``unstage``:
  ``NodeUnstageVolume``, then the staging folder; ``detach``: the VolumeAttachment deleted.
A CSI call that failed with a non-final code leaves the mount or stage ``UNCERTAIN``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from podvisor.common.crashpoints import NEVER, CrashPoints
from podvisor.common.ownership import set_volume_ownership
from podvisor.services.volumes.apitypes import dig
from podvisor.services.volumes.csiclient import Cap, Capability, CsiClient, CsiError
from podvisor.services.volumes.mounter import Mounter, is_mount_point
from podvisor.services.volumes.pluginops import PluginFailed, PluginMounts
from podvisor.services.volumes.spec import NET_PLUGINS, Plugin, VolumePaths, VolumeSpec
from podvisor.services.volumes.state import (
    ActualState,
    Device,
    DeviceRecord,
    Mounted,
    MountKey,
    MountRecord,
    Step,
    device_of,
)

FAILED_MOUNT = "FailedMount"
FAILED_ATTACH = "FailedAttachVolume"
VOL_DATA = "vol_data.json"
STORAGE = "/apis/storage.k8s.io/v1"


class OpFailed(Exception):
    """``reason``: the event's (FailedMount, FailedAttachVolume); ``uncertain``: the
    operation may have happened (a non-final CSI error)."""

    def __init__(self, reason: str, message: str, uncertain: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.uncertain = uncertain


class ApiWriter(Protocol):
    def get(self, path: str) -> Mapping[str, Any] | None: ...

    def create(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]: ...

    def delete(self, path: str) -> None:
        """404 counts as done."""
        ...


class Drivers(Protocol):
    def client(self, driver: str) -> CsiClient:
        """The registered plugin's client; raises ``LookupError`` when none is."""
        ...


def attachment_name(handle: str, driver: str, node: str) -> str:
    return "csi-" + hashlib.sha256(f"{handle}{driver}{node}".encode()).hexdigest()


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _rmdir(path: Path) -> None:
    """Remove ``path`` if it is an empty folder (never across a mount: rmdir only)."""
    with contextlib.suppress(FileNotFoundError):
        path.rmdir()


class Operations:
    def __init__(self, paths: VolumePaths, mounter: Mounter, drivers: Drivers,
                 api: ApiWriter | None, node: str, crash: CrashPoints = NEVER,
                 log: Callable[..., None] = lambda event, **fields: None,
                 plugins: PluginMounts | None = None) -> None:
        self.paths = paths
        self.plugins = plugins  # nfs, iscsi, fc, flexVolume (issue 24)
        self.mounter = mounter
        self.drivers = drivers
        self.api = api
        self.node = node
        self.crash = crash
        self.log = log
        self.contexts: dict[str, Mapping[str, str]] = {}  # unique name -> publish context

    def run(self, step: Step, actual: ActualState) -> None:
        getattr(self, step.op.value)(step, actual)

    # -- helpers -------------------------------------------------------------------------------
    def _client(self, driver: str, what: str) -> CsiClient:
        try:
            return self.drivers.client(driver)
        except LookupError:
            raise OpFailed(FAILED_MOUNT, f"kubernetes.io/csi: {what} failed to get CSI client: "
                                         f"driver name {driver} not found in the list of "
                                         "registered CSI drivers") from None

    def _secrets(self, ref: tuple[str, str] | None) -> dict[str, str]:
        return {k: v.decode(errors="replace") for k, v in self._secret_data(ref).items()}

    def _secret_data(self, ref: tuple[str, str] | None) -> dict[str, bytes]:
        if ref is None:
            return {}
        ns, name = ref
        if self.api is None:
            raise OpFailed(FAILED_MOUNT, f"fetching secret {ns}/{name}: no API server "
                                         "(kubeconfig)")
        try:
            obj = self.api.get(f"/api/v1/namespaces/{ns}/secrets/{name}")
        except OSError as err:
            raise OpFailed(FAILED_MOUNT, f"fetching secret {ns}/{name}: {err}") from None
        if obj is None:
            raise OpFailed(FAILED_MOUNT, f'secrets "{name}" not found')
        data = dig(obj, "data")
        return {str(k): base64.b64decode(v)
                for k, v in (data.items() if isinstance(data, Mapping) else ())}

    @staticmethod
    def _csi_failed(what: str, spec_volume: str, err: CsiError) -> OpFailed:
        return OpFailed(FAILED_MOUNT, f'{what} failed for volume "{spec_volume}" : {err}',
                        uncertain=not err.final)

    def _context(self, spec: VolumeSpec) -> dict[str, str]:
        assert spec.csi is not None
        out = dict(spec.csi.source.attributes)
        if spec.csi.pod_info or spec.csi.ephemeral:
            out.update({"csi.storage.k8s.io/pod.name": spec.pod_name,
                        "csi.storage.k8s.io/pod.namespace": spec.pod_namespace,
                        "csi.storage.k8s.io/pod.uid": spec.pod_uid,
                        "csi.storage.k8s.io/serviceAccount.name": spec.service_account,
                        "csi.storage.k8s.io/ephemeral": str(spec.csi.ephemeral).lower()})
        return out

    def _capability(self, spec: VolumeSpec, client: CsiClient) -> Capability:
        assert spec.csi is not None
        group = ""
        if spec.fs_group is not None and Cap.VOLUME_MOUNT_GROUP in client.capabilities():
            group = str(spec.fs_group)
        return Capability(spec.csi.access_mode, spec.csi.source.fs_type, group)

    # -- attach / detach ---------------------------------------------------------------------
    def attach(self, step: Step, actual: ActualState) -> None:
        spec = step.spec
        assert spec is not None and spec.csi is not None
        if self.api is None:
            raise OpFailed(FAILED_ATTACH, "no API server to attach through")
        src = spec.csi.source
        name = attachment_name(src.handle, src.driver, self.node)
        device = Device(spec.unique_name, src.driver, src.handle, name)
        folder = self.paths.staging(src.driver, src.handle).parent
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / VOL_DATA, {"driverName": src.driver, "volumeHandle": src.handle,
                                       "attachmentID": name})
        record = actual.devices.setdefault(spec.unique_name, DeviceRecord(device))
        record.device = device
        path = f"{STORAGE}/volumeattachments/{name}"
        try:
            va = self.api.get(path)
            if va is None:
                va = self.api.create(f"{STORAGE}/volumeattachments", {
                    "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                    "metadata": {"name": name},
                    "spec": {"attacher": src.driver, "nodeName": self.node,
                             "source": {"persistentVolumeName": spec.spec_name}}})
        except OSError as err:
            raise OpFailed(FAILED_ATTACH, f'AttachVolume.Attach failed for volume '
                                          f'"{spec.spec_name}" : {err}') from None
        error = dig(va, "status", "attachError", "message")
        if isinstance(error, str) and error:
            raise OpFailed(FAILED_ATTACH, f'AttachVolume.Attach failed for volume '
                                          f'"{spec.spec_name}" : rpc error: {error}')
        if dig(va, "status", "attached") is not True:
            raise OpFailed("", f'waiting for VolumeAttachment "{name}" of volume '
                               f'"{spec.spec_name}" to be attached')
        meta = dig(va, "status", "attachmentMetadata")
        self.contexts[spec.unique_name] = {str(k): str(v) for k, v in meta.items()} \
            if isinstance(meta, Mapping) else {}
        record.attached = True

    def detach(self, step: Step, actual: ActualState) -> None:
        dev = step.device
        if dev.attach_id and self.api is not None:
            try:
                self.api.delete(f"{STORAGE}/volumeattachments/{dev.attach_id}")
                if self.api.get(f"{STORAGE}/volumeattachments/{dev.attach_id}") is not None:
                    raise OpFailed("", f'waiting for VolumeAttachment "{dev.attach_id}" to go')
            except OSError as err:
                raise OpFailed("", f"DetachVolume.Detach failed for volume "
                                   f'"{dev.unique_name}" : {err}') from None
        self._forget_device(dev, actual)

    def _forget_device(self, dev: Device, actual: ActualState) -> None:
        folder = self.paths.staging(dev.driver, dev.handle).parent if dev.driver else None
        actual.devices.pop(dev.unique_name, None)
        self.contexts.pop(dev.unique_name, None)
        if folder is not None:
            (folder / VOL_DATA).unlink(missing_ok=True)
            _rmdir(folder / "globalmount")
            _rmdir(folder)

    # -- stage / unstage -----------------------------------------------------------------------
    def stage(self, step: Step, actual: ActualState) -> None:
        spec = step.spec
        assert spec is not None and spec.csi is not None
        src = spec.csi.source
        record = actual.devices.setdefault(spec.unique_name,
                                           DeviceRecord(device_of(spec), attached=True))
        client = self._client(src.driver, "MountVolume.MountDevice")
        try:
            stages = client.stages()
        except CsiError as err:
            raise self._csi_failed("MountVolume.MountDevice", spec.spec_name, err) from None
        if not stages:
            record.staged = Mounted.YES  # nothing to stage: the plugin publishes directly
            return
        staging = self.paths.staging(src.driver, src.handle)
        staging.parent.mkdir(parents=True, exist_ok=True)
        write_json(staging.parent / VOL_DATA, {
            "driverName": src.driver, "volumeHandle": src.handle,
            "attachmentID": record.device.attach_id})
        staging.mkdir(mode=0o750, exist_ok=True)
        record.staged = Mounted.UNCERTAIN
        try:
            client.stage(src.handle, str(staging), self._capability(spec, client),
                         self.contexts.get(spec.unique_name, {}),
                         self._secrets(src.stage_secret), self._context(spec))
        except CsiError as err:
            if err.final:
                record.staged = Mounted.NO if record.staged is Mounted.UNCERTAIN \
                    else record.staged
            raise self._csi_failed("MountVolume.MountDevice", spec.spec_name, err) from None
        record.staged = Mounted.YES
        self.log("volumes.staged", volume=spec.spec_name, driver=src.driver,
                 staging_path=str(staging))
        self.crash.hit("csi.after_stage")

    def unstage(self, step: Step, actual: ActualState) -> None:
        dev = step.device
        record = actual.devices.get(dev.unique_name)
        staging = self.paths.staging(dev.driver, dev.handle)
        if dev.driver:
            client = self._client(dev.driver, "UnmountDevice")
            try:
                if client.stages():
                    client.unstage(dev.handle, str(staging))
            except CsiError as err:
                raise OpFailed("", f'UnmountDevice failed for volume "{dev.unique_name}" : '
                                   f"{err}") from None
        self.log("volumes.unstaged", volume=dev.unique_name, driver=dev.driver,
                 staging_path=str(staging))
        if record is not None and (record.attached or dev.attach_id):
            record.staged = Mounted.NO
            _rmdir(staging)
            return  # detach next
        self._forget_device(dev, actual)

    # -- mount / unmount -----------------------------------------------------------------------
    def mount(self, step: Step, actual: ActualState) -> None:
        spec, key = step.spec, step.key
        assert spec is not None and key is not None
        if spec.plugin is Plugin.HOST_PATH:
            actual.mounts[key] = MountRecord(key, device_of(spec), Mounted.YES, spec)
            return
        folder = self.paths.pod_volume(spec.pod_uid, spec.plugin, spec.spec_name, spec.driver)
        if spec.plugin is Plugin.LOCAL:
            self._mount_local(spec, key, folder, actual)
        elif spec.plugin in NET_PLUGINS or spec.plugin is Plugin.FLEX:
            self._mount_plugin(spec, key, folder, actual)
        else:
            self._publish(spec, key, folder, actual)

    def _mount_plugin(self, spec: VolumeSpec, key: MountKey, folder: Path,
                      actual: ActualState) -> None:
        if self.plugins is None:
            raise OpFailed(FAILED_MOUNT, f'MountVolume.SetUp failed for volume '
                                         f'"{spec.spec_name}" : no volume plugins here')
        try:
            secret = self._secret_data(spec.secret)
        except OpFailed as err:  # the kubelet's addSecretsToOptions wording
            assert spec.secret is not None
            raise OpFailed(FAILED_MOUNT, f'MountVolume.SetUp failed for volume '
                                         f'"{spec.spec_name}" : couldn\'t get secret '
                                         f"{'/'.join(spec.secret)} err: {err.message}") from None
        record = actual.mounts.setdefault(key, MountRecord(key, device_of(spec),
                                                           Mounted.UNCERTAIN, spec))
        record.spec = spec
        try:
            self.plugins.setup(spec, folder, secret)
        except PluginFailed as err:
            if not err.uncertain and record.state is not Mounted.YES \
                    and not is_mount_point(self.mounter, str(folder)):
                del actual.mounts[key]
            raise OpFailed(FAILED_MOUNT, f'{err.op} failed for volume "{spec.spec_name}" : '
                                         f"{err.message}", err.uncertain) from None
        record.state = Mounted.YES

    def _mount_local(self, spec: VolumeSpec, key: MountKey, folder: Path,
                     actual: ActualState) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        record = actual.mounts.setdefault(key, MountRecord(key, device_of(spec),
                                                           Mounted.UNCERTAIN, spec))
        record.spec = spec
        try:
            if not is_mount_point(self.mounter, str(folder)):
                if not os.path.isdir(spec.path):
                    raise OpFailed(FAILED_MOUNT, f'MountVolume.SetUp failed for volume '
                                                 f'"{spec.spec_name}" : path "{spec.path}" '
                                                 "does not exist")
                self.mounter.bind(spec.path, str(folder), spec.read_only)
            if spec.fs_group is not None and not spec.read_only:
                set_volume_ownership(folder, spec.fs_group, spec.on_root_mismatch)
        except OSError as err:
            raise OpFailed(FAILED_MOUNT, f'MountVolume.SetUp failed for volume '
                                         f'"{spec.spec_name}" : {err}') from None
        record.state = Mounted.YES

    def _publish(self, spec: VolumeSpec, key: MountKey, folder: Path,
                 actual: ActualState) -> None:
        assert spec.csi is not None
        src = spec.csi.source
        client = self._client(src.driver, "MountVolume.SetUp")
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / VOL_DATA, {
            "driverName": src.driver, "volumeHandle": src.handle, "specVolID": spec.spec_name,
            "volumeLifecycleMode": "Ephemeral" if spec.csi.ephemeral else "Persistent",
            "podUID": spec.pod_uid})
        record = actual.mounts.setdefault(key, MountRecord(key, device_of(spec),
                                                           Mounted.UNCERTAIN, spec))
        record.spec = spec
        target = folder / "mount"
        try:
            staging = str(self.paths.staging(src.driver, src.handle)) \
                if client.stages() and not spec.csi.ephemeral else ""
            capability = self._capability(spec, client)
            client.publish(src.handle, str(target), staging, capability, spec.read_only,
                           self.contexts.get(spec.unique_name, {}),
                           self._secrets(src.publish_secret), self._context(spec))
        except CsiError as err:
            if err.final:
                record.state = Mounted.NO if record.state is not Mounted.YES else record.state
                if record.state is Mounted.NO:
                    del actual.mounts[key]
            raise self._csi_failed("MountVolume.SetUp", spec.spec_name, err) from None
        record.state = Mounted.YES
        self.log("volumes.published", pod_uid=spec.pod_uid, volume=spec.volume,
                 driver=src.driver, target_path=str(target))
        if spec.fs_group is not None and not spec.read_only and not capability.mount_group \
                and _fs_group_applies(spec):
            try:
                set_volume_ownership(target, spec.fs_group, spec.on_root_mismatch)
            except OSError as err:
                raise OpFailed(FAILED_MOUNT, f'MountVolume.SetUp failed for volume '
                                             f'"{spec.spec_name}" : applying fsGroup: '
                                             f"{err}") from None

    def unmount(self, step: Step, actual: ActualState) -> None:
        key, dev = step.key, step.device
        assert key is not None
        folder = self.paths.pod_volume(key.pod_uid, key.plugin, key.spec_name, key.driver)
        if (key.plugin in NET_PLUGINS or key.plugin is Plugin.FLEX) and self.plugins is not None:
            try:
                self.plugins.teardown(key, folder)
            except PluginFailed as err:
                raise OpFailed("", f'{err.op} failed for volume "{key.spec_name}" : '
                                   f"{err.message}") from None
        elif key.plugin is Plugin.LOCAL:
            try:
                while is_mount_point(self.mounter, str(folder)):
                    self.mounter.unmount(str(folder))
            except OSError as err:
                raise OpFailed("", f'UnmountVolume.TearDown failed for volume '
                                   f'"{key.spec_name}" : {err}') from None
            _rmdir(folder)
        elif key.plugin is Plugin.CSI:
            client = self._client(dev.driver, "UnmountVolume.TearDown")
            target = folder / "mount"
            try:
                client.unpublish(dev.handle, str(target))
            except CsiError as err:
                raise OpFailed("", f'UnmountVolume.TearDown failed for volume '
                                   f'"{key.spec_name}" : {err}') from None
            if target.exists() and not is_mount_point(self.mounter, str(target)):
                _rmdir(target)  # the spec has the plugin remove it; never across a mount
            (folder / VOL_DATA).unlink(missing_ok=True)
            _rmdir(folder)
            self.log("volumes.unpublished", pod_uid=key.pod_uid, volume=key.spec_name,
                     driver=dev.driver, target_path=str(target))
        actual.mounts.pop(key, None)
        _prune_pod_folders(self.paths, key.pod_uid, folder.parent.name)


def _fs_group_applies(spec: VolumeSpec) -> bool:
    """The CSIDriver's ``fsGroupPolicy``: ``File`` always, ``None`` never,
    ``ReadWriteOnceWithFSType`` (the default) with an fsType and a ReadWriteOnce volume."""
    assert spec.csi is not None
    policy = spec.csi.fs_group_policy
    if policy == "File":
        return True
    if policy == "None":
        return False
    return bool(spec.csi.source.fs_type) and spec.csi.access_mode == "ReadWriteOnce"


def _prune_pod_folders(paths: VolumePaths, pod_uid: str, folder: str) -> None:
    """Once a pod's last mounted volume is gone, its empty ``volumes/<plugin>`` folders go (the
    rest of ``pods/<uid>`` is the sync loop's, which removes it without crossing mounts)."""
    base = paths.pods / pod_uid / "volumes"
    for name in {Plugin.CSI.folder, Plugin.LOCAL.folder, folder}:
        try:
            (base / name).rmdir()
        except OSError:
            continue
    for path in (base, paths.pods / pod_uid):
        try:
            path.rmdir()
        except OSError:
            return


__all__ = ["FAILED_ATTACH", "FAILED_MOUNT", "VOL_DATA", "ApiWriter", "Drivers", "OpFailed",
           "Operations", "attachment_name"]
