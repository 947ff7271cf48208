"""The actual state of the world (what is attached, staged and mounted on this node) and the
reconciler's plan: the pure comparison of the desired state with it (the kubelet's
``reconciler.reconcile``: unmount what no pod wants, then unstage, then detach; then attach,
stage and mount what a pod wants and has not).

A mount or stage is ``UNCERTAIN`` when it may or may not have happened: an operation that
failed with a non-final error (a timeout, a driver gone), or one found on disk by the
reconstruction after a restart. An uncertain mount is torn down when no pod wants it (so
nothing is left behind) and done again, idempotently, when one does (so nothing is missing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from podvisor.services.volumes.spec import Plugin, VolumeSpec


class Mounted(StrEnum):
    NO = "no"
    UNCERTAIN = "uncertain"
    YES = "yes"


@dataclass(frozen=True)
class MountKey:
    """A pod's volume folder: ``pods/<uid>/volumes/<plugin>/<spec_name>``."""

    pod_uid: str
    plugin: Plugin
    spec_name: str
    driver: str = ""  # a flexVolume's driver (its folder)

    @classmethod
    def of(cls, spec: VolumeSpec) -> MountKey:
        return cls(spec.pod_uid, spec.plugin, spec.spec_name, spec.driver)


@dataclass(frozen=True)
class Device:
    """What a CSI node call of a volume needs, from the spec or from ``vol_data.json``."""

    unique_name: str
    driver: str = ""
    handle: str = ""
    attach_id: str = ""  # the VolumeAttachment podvisor made ("" when none)


@dataclass
class MountRecord:
    key: MountKey
    device: Device
    state: Mounted
    spec: VolumeSpec | None = None  # None: reconstructed from disk


@dataclass
class DeviceRecord:
    device: Device
    attached: bool = False  # podvisor's VolumeAttachment is attached
    staged: Mounted = Mounted.NO


@dataclass
class ActualState:
    mounts: dict[MountKey, MountRecord] = field(default_factory=dict)
    devices: dict[str, DeviceRecord] = field(default_factory=dict)

    def device(self, spec: VolumeSpec) -> DeviceRecord | None:
        return self.devices.get(spec.unique_name)

    def mounted(self, spec: VolumeSpec) -> bool:
        record = self.mounts.get(MountKey.of(spec))
        return record is not None and record.state is Mounted.YES


def device_of(spec: VolumeSpec) -> Device:
    csi = spec.csi
    if csi is None:
        return Device(spec.unique_name)
    return Device(spec.unique_name, csi.source.driver, csi.source.handle)


class Op(StrEnum):
    UNMOUNT = "unmount"
    UNSTAGE = "unstage"
    DETACH = "detach"
    ATTACH = "attach"
    STAGE = "stage"
    MOUNT = "mount"


@dataclass(frozen=True)
class Step:
    """One operation of the plan: ``op`` on a pod's mount (``key``) or a device."""

    op: Op
    device: Device
    key: MountKey | None = None
    spec: VolumeSpec | None = None


def plan(desired: Mapping[MountKey, VolumeSpec], actual: ActualState,
         synced: bool) -> list[Step]:
    """The steps that bring ``actual`` to ``desired``, teardown first. Nothing is torn down
    until ``synced`` (the desired state holds every pod the sync loop wants: a restarted
    volume manager must not unmount a running pod's volume before it has heard of the pod).
    One step per volume: a mount waits for its device's attach and stage to be done."""
    steps: list[Step] = []
    wanted_devices = {s.unique_name for s in desired.values()}
    if synced:
        for key, record in sorted(actual.mounts.items(), key=lambda kv: _order(kv[0])):
            if key not in desired:
                steps.append(Step(Op.UNMOUNT, record.device, key))
        mounted_devices = {r.device.unique_name for r in actual.mounts.values()}
        for name, dev in sorted(actual.devices.items()):
            if name in wanted_devices or name in mounted_devices:
                continue
            if dev.staged is not Mounted.NO:
                steps.append(Step(Op.UNSTAGE, dev.device))
            elif dev.attached or dev.device.attach_id:
                steps.append(Step(Op.DETACH, dev.device))
    for key, spec in sorted(desired.items(), key=lambda kv: _order(kv[0])):
        device = actual.devices.get(spec.unique_name)
        if spec.attachable and (device is None or not device.attached):
            steps.append(Step(Op.ATTACH, device_of(spec), key, spec))
        elif spec.device_mountable and (device is None or device.staged is not Mounted.YES):
            steps.append(Step(Op.STAGE, device_of(spec), key, spec))
        elif not actual.mounted(spec):
            steps.append(Step(Op.MOUNT, device_of(spec), key, spec))
    return _unique(steps)


def _order(key: MountKey) -> tuple[str, str, str, str]:
    return key.pod_uid, str(key.plugin), key.driver, key.spec_name


def _unique(steps: list[Step]) -> list[Step]:
    """Two pods of one device want it attached or staged once per pass."""
    seen: set[tuple[Op, str]] = set()
    out: list[Step] = []
    for step in steps:
        if step.op in (Op.ATTACH, Op.STAGE, Op.UNSTAGE, Op.DETACH):
            mark = (step.op, step.device.unique_name)
            if mark in seen:
                continue
            seen.add(mark)
        out.append(step)
    return out
