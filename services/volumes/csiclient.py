"""A CSI node-plugin client: the CSI spec's ``csi.v1`` Node and Identity services over gRPC
on the plugin's unix socket (stubs generated from the spec's ``csi.proto`` at build time,
``stubs/``).

What it calls, as the kubelet's csi plugin does: ``NodeGetInfo`` (registration),
``NodeGetCapabilities`` (per call site, cached per client), ``NodeStageVolume`` /
``NodeUnstageVolume`` only when the plugin offers ``STAGE_UNSTAGE_VOLUME``,
``NodePublishVolume`` / ``NodeUnpublishVolume``, ``NodeGetVolumeStats`` when it offers
``GET_VOLUME_STATS``. Every call has a deadline (``timeout``). Failures raise ``CsiError``
with the gRPC code; ``final`` is False for the codes after which the operation may or may not
have happened (the kubelet's ``isFinalError``: Canceled, DeadlineExceeded, Unavailable,
ResourceExhausted, Aborted), so the caller treats the mount as uncertain. Thread-safe (one
gRPC channel).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc

from podvisor.ipc.volumemaps import VolumeStats
from podvisor.services.volumes.stubs import csi_pb2 as pb
from podvisor.services.volumes.stubs import csi_pb2_grpc as rpc

TIMEOUT = 120.0  # the kubelet's csiTimeout (2 min) for stage/publish and their inverses
INFO_TIMEOUT = 15.0
_UNCERTAIN = frozenset({grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                        grpc.StatusCode.ABORTED})
Cap = pb.NodeServiceCapability.RPC
_MODES = {"ReadWriteOnce": pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER,
          "ReadOnlyMany": pb.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY,
          "ReadWriteMany": pb.VolumeCapability.AccessMode.MULTI_NODE_MULTI_WRITER,
          "ReadWriteOncePod": pb.VolumeCapability.AccessMode.SINGLE_NODE_SINGLE_WRITER}


class CsiError(Exception):
    def __init__(self, call: str, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"rpc error: code = {code.name.title().replace('_', '')} desc = "
                         f"{message}")
        self.call = call
        self.code = code
        self.final = code not in _UNCERTAIN


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    max_volumes: int = 0
    topology: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Capability:
    """The volume capability of a call: a mount volume (``fs_type``, ``mount_group``) with
    the PV's access mode (the kubelet's mapping; ``SINGLE_NODE_MULTI_WRITER`` and
    ``SINGLE_NODE_SINGLE_WRITER`` only when the plugin offers them)."""

    access_mode: str = "ReadWriteOnce"
    fs_type: str = ""
    mount_group: str = ""
    block: bool = False  # a raw block volume: block access type, not mount

    def to_pb(self, caps: frozenset[int]) -> pb.VolumeCapability:
        mode = _MODES.get(self.access_mode, pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER)
        if self.access_mode == "ReadWriteOnce" and Cap.SINGLE_NODE_MULTI_WRITER in caps:
            mode = pb.VolumeCapability.AccessMode.SINGLE_NODE_MULTI_WRITER
        if mode == pb.VolumeCapability.AccessMode.SINGLE_NODE_SINGLE_WRITER and \
                Cap.SINGLE_NODE_MULTI_WRITER not in caps:
            mode = pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
        access = pb.VolumeCapability.AccessMode(mode=mode)
        if self.block:
            return pb.VolumeCapability(block=pb.VolumeCapability.BlockVolume(),
                                       access_mode=access)
        return pb.VolumeCapability(
            mount=pb.VolumeCapability.MountVolume(fs_type=self.fs_type,
                                                  volume_mount_group=self.mount_group),
            access_mode=access)


class CsiClient:
    """One plugin's node service at ``endpoint`` (a unix socket path)."""

    def __init__(self, endpoint: str, timeout: float = TIMEOUT) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._channel = grpc.insecure_channel(f"unix://{endpoint}")
        self._node = rpc.NodeStub(self._channel)  # type: ignore[no-untyped-call]
        self._identity = rpc.IdentityStub(self._channel)  # type: ignore[no-untyped-call]
        self._caps: frozenset[int] | None = None

    def close(self) -> None:
        self._channel.close()

    def _call(self, name: str, fn: object, request: object, timeout: float) -> object:
        try:
            return fn(request, timeout=timeout)  # type: ignore[operator]
        except grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
            details = err.details() if hasattr(err, "details") else str(err)
            raise CsiError(name, code, details or "") from None

    def plugin_name(self) -> str:
        resp = self._call("GetPluginInfo", self._identity.GetPluginInfo,
                          pb.GetPluginInfoRequest(), INFO_TIMEOUT)
        assert isinstance(resp, pb.GetPluginInfoResponse)
        return resp.name

    def node_info(self) -> NodeInfo:
        resp = self._call("NodeGetInfo", self._node.NodeGetInfo, pb.NodeGetInfoRequest(),
                          INFO_TIMEOUT)
        assert isinstance(resp, pb.NodeGetInfoResponse)
        return NodeInfo(resp.node_id, resp.max_volumes_per_node,
                        dict(resp.accessible_topology.segments))

    def capabilities(self) -> frozenset[int]:
        if self._caps is None:
            resp = self._call("NodeGetCapabilities", self._node.NodeGetCapabilities,
                              pb.NodeGetCapabilitiesRequest(), INFO_TIMEOUT)
            assert isinstance(resp, pb.NodeGetCapabilitiesResponse)
            self._caps = frozenset(c.rpc.type for c in resp.capabilities if c.HasField("rpc"))
        return self._caps

    def stages(self) -> bool:
        return Cap.STAGE_UNSTAGE_VOLUME in self.capabilities()

    def stage(self, volume_id: str, staging_path: str, capability: Capability,
              publish_context: Mapping[str, str], secrets: Mapping[str, str],
              context: Mapping[str, str]) -> None:
        self._call("NodeStageVolume", self._node.NodeStageVolume, pb.NodeStageVolumeRequest(
            volume_id=volume_id, publish_context=dict(publish_context),
            staging_target_path=staging_path,
            volume_capability=capability.to_pb(self.capabilities()), secrets=dict(secrets),
            volume_context=dict(context)), self.timeout)

    def unstage(self, volume_id: str, staging_path: str) -> None:
        self._call("NodeUnstageVolume", self._node.NodeUnstageVolume,
                   pb.NodeUnstageVolumeRequest(volume_id=volume_id,
                                               staging_target_path=staging_path), self.timeout)

    def publish(self, volume_id: str, target: str, staging_path: str, capability: Capability,
                read_only: bool, publish_context: Mapping[str, str],
                secrets: Mapping[str, str], context: Mapping[str, str]) -> None:
        """``staging_path`` "" when the plugin does not stage."""
        self._call("NodePublishVolume", self._node.NodePublishVolume,
                   pb.NodePublishVolumeRequest(
                       volume_id=volume_id, publish_context=dict(publish_context),
                       staging_target_path=staging_path, target_path=target,
                       volume_capability=capability.to_pb(self.capabilities()),
                       readonly=read_only, secrets=dict(secrets),
                       volume_context=dict(context)), self.timeout)

    def unpublish(self, volume_id: str, target: str) -> None:
        self._call("NodeUnpublishVolume", self._node.NodeUnpublishVolume,
                   pb.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target),
                   self.timeout)

    def volume_stats(self, volume_id: str, volume_path: str, staging_path: str,
                     now: float) -> VolumeStats | None:
        """The volume's usage at wall time ``now``; None when the plugin does not offer
        ``GET_VOLUME_STATS``."""
        if Cap.GET_VOLUME_STATS not in self.capabilities():
            return None
        resp = self._call("NodeGetVolumeStats", self._node.NodeGetVolumeStats,
                          pb.NodeGetVolumeStatsRequest(volume_id=volume_id,
                                                       volume_path=volume_path,
                                                       staging_target_path=staging_path),
                          INFO_TIMEOUT)
        assert isinstance(resp, pb.NodeGetVolumeStatsResponse)
        out = {"bytes": (0, 0, 0), "inodes": (0, 0, 0)}
        for u in resp.usage:
            key = "bytes" if u.unit == pb.VolumeUsage.BYTES else "inodes"
            out[key] = (u.used, u.total, u.available)
        (used, total, avail), (iused, itotal, ifree) = out["bytes"], out["inodes"]
        return VolumeStats(now, used, total, avail, itotal, ifree, iused)
