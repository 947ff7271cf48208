"""The ``volumes`` map's values (owner: the ``volumes`` process; issue 25).

Key pod UID: ``PodVolumes``, the pod's volumes that the volume manager mounts (claims,
ephemeral and inline csi volumes), each a ``MountedVolume``: whether it is ready for the pod's
containers and the host path their mounts bind, or why not (the sync loop waits for
``ready``). Key ``_node`` (``NODE_KEY``): ``NodeVolumes``, what the Node's status reports
(``volumesInUse``, ``volumesAttached``) once the reconciler's states are synced. Told apart by
the wire's ``kind`` (``decode_volumes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from podvisor.ipc.wire import (
    MapValueError,
    read_bool,
    read_float,
    read_int,
    read_list,
    read_map,
    read_str,
)

__all__ = ["NODE_KEY", "AttachedVolume", "MountedVolume", "NodeVolumes", "PodVolumes",
           "VolumeStats", "VolumesValue", "decode_volumes"]

NODE_KEY = "_node"


@dataclass(frozen=True)
class VolumeStats:
    """A volume's usage, as ``/stats/summary``'s ``VolumeStats`` (``time``: wall seconds)."""

    time: float = 0.0
    used_bytes: int = 0
    capacity_bytes: int = 0
    available_bytes: int = 0
    inodes: int = 0
    inodes_free: int = 0
    inodes_used: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {"time": self.time, "used_bytes": self.used_bytes,
                "capacity_bytes": self.capacity_bytes, "available_bytes": self.available_bytes,
                "inodes": self.inodes, "inodes_free": self.inodes_free,
                "inodes_used": self.inodes_used}

    @classmethod
    def from_wire(cls, raw: Any) -> VolumeStats:
        m = read_map(raw, "volume stats")
        return cls(read_float(m, "time", "volume stats"),
                   *(read_int(m, k, "volume stats") for k in (
                       "used_bytes", "capacity_bytes", "available_bytes", "inodes",
                       "inodes_free", "inodes_used")))


@dataclass(frozen=True)
class MountedVolume:
    """One volume of a pod. ``name``: the pod's volume name; ``ready``: set up, and
    ``host_path`` is what the containers' mounts bind; ``read_only``: mount it read-only;
    ``unique_name``: the kubelet's unique volume name (``kubernetes.io/csi/<driver>^<handle>``,
    ``kubernetes.io/local-volume/<pv>``, ...); ``claim``: the PersistentVolumeClaim it comes
    from ('' for an inline csi volume); ``reason``/``message``: why it is not ready
    (``FailedMount``, ``FailedAttachVolume``); ``stats``: its usage (None before a reading);
    ``block``: a raw block volume (``volumeMode: Block``): ``host_path`` is the pod's device
    map path (a symlink to the device), given to the containers as a CRI device, not a mount."""

    name: str
    ready: bool = False
    host_path: str = ""
    read_only: bool = False
    unique_name: str = ""
    claim: str = ""
    reason: str = ""
    message: str = ""
    stats: VolumeStats | None = None
    block: bool = False

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "ready": self.ready,
                               "host_path": self.host_path, "read_only": self.read_only,
                               "unique_name": self.unique_name, "claim": self.claim,
                               "reason": self.reason, "message": self.message,
                               "block": self.block}
        if self.stats is not None:
            out["stats"] = self.stats.to_wire()
        return out

    @classmethod
    def from_wire(cls, raw: Any) -> MountedVolume:
        m = read_map(raw, "mounted volume")
        what = "mounted volume"
        return cls(read_str(m, "name", what), read_bool(m, "ready", what),
                   read_str(m, "host_path", what), read_bool(m, "read_only", what),
                   read_str(m, "unique_name", what), read_str(m, "claim", what),
                   read_str(m, "reason", what), read_str(m, "message", what),
                   VolumeStats.from_wire(m["stats"]) if m.get("stats") is not None else None,
                   read_bool(m, "block", what) if "block" in m else False)


@dataclass(frozen=True)
class PodVolumes:
    """A ``volumes`` value under a pod UID: its mounted volumes by the pod's volume name."""

    VERSION: ClassVar[int] = 1
    KIND: ClassVar[str] = "pod"
    name: str = ""
    namespace: str = ""
    volumes: Mapping[str, MountedVolume] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return all(v.ready for v in self.volumes.values())

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.VERSION, "kind": self.KIND, "name": self.name,
                "namespace": self.namespace,
                "volumes": {n: v.to_wire() for n, v in self.volumes.items()}}

    @classmethod
    def from_wire(cls, raw: Any) -> PodVolumes:
        m = read_map(raw, "pod volumes")
        vols = read_map(m.get("volumes", {}), "pod volumes")
        return cls(read_str(m, "name", "pod volumes"), read_str(m, "namespace", "pod volumes"),
                   {str(n): MountedVolume.from_wire(v) for n, v in vols.items()})


@dataclass(frozen=True)
class AttachedVolume:
    """An entry of the Node's ``status.volumesAttached``."""

    name: str
    device_path: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "device_path": self.device_path}

    @classmethod
    def from_wire(cls, raw: Any) -> AttachedVolume:
        m = read_map(raw, "attached volume")
        return cls(read_str(m, "name", "attached volume"),
                   read_str(m, "device_path", "attached volume"))


@dataclass(frozen=True)
class NodeVolumes:
    """The ``_node`` value: ``synced`` once the reconciler has seen the pods the sync loop
    wants (the kubelet's ``ReconcilerStatesHasBeenSynced``: until then the Node's volume
    fields are left as they are); ``in_use``: the unique names of the attachable volumes
    desired or mounted (``volumesInUse``); ``attached``: those podvisor attached
    (``volumesAttached``)."""

    VERSION: ClassVar[int] = 1
    KIND: ClassVar[str] = "node"
    synced: bool = False
    in_use: tuple[str, ...] = ()
    attached: tuple[AttachedVolume, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.VERSION, "kind": self.KIND, "synced": self.synced,
                "in_use": list(self.in_use), "attached": [a.to_wire() for a in self.attached]}

    @classmethod
    def from_wire(cls, raw: Any) -> NodeVolumes:
        m = read_map(raw, "node volumes")
        in_use = read_list(m, "in_use", "node volumes")
        if not all(isinstance(n, str) for n in in_use):
            raise MapValueError("fields", "node volumes: in_use not strings")
        return cls(read_bool(m, "synced", "node volumes"), tuple(in_use),
                   tuple(AttachedVolume.from_wire(a)
                         for a in read_list(m, "attached", "node volumes")))


VolumesValue = PodVolumes | NodeVolumes


def decode_volumes(raw: Any) -> VolumesValue:
    """A ``volumes`` value from its wire form (by its ``kind``)."""
    m = read_map(raw, "volumes")
    if m.get("v") != 1:
        raise MapValueError("version", f"volumes v{m.get('v')!r}")
    kind = m.get("kind")
    if kind == PodVolumes.KIND:
        return PodVolumes.from_wire(m)
    if kind == NodeVolumes.KIND:
        return NodeVolumes.from_wire(m)
    raise MapValueError("fields", f"volumes: unknown kind {kind!r}")
