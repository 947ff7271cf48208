"""A CSI node plugin written for the tests (issue 25), run as its own process: the CSI spec's
Identity and Node services (``csi.v1``, the stubs podvisor generates from the spec's
``csi.proto``) and the kubelet's plugin-registration service, like a driver beside its
node-driver-registrar.

It keeps the spec's rules strictly, so that a client relying on anything the spec does not
promise fails here:
- required fields (``volume_id``, the paths, ``volume_capability``): ``INVALID_ARGUMENT``;
- an unknown volume (no folder ``<data>/<volume_id>``): ``NOT_FOUND``;
- ``NodeStageVolume``: the staging path must exist and be a folder (the CO makes it:
  ``FAILED_PRECONDITION`` otherwise); staged again at the same path with the same
  capability is OK (idempotent), with another capability ``ALREADY_EXISTS``;
- ``NodePublishVolume``: with ``STAGE_UNSTAGE_VOLUME`` offered the volume must have been
  staged at the ``staging_target_path`` given (``FAILED_PRECONDITION``); the target's parent
  must exist (the CO's job), the target itself is made by the plugin; published again alike
  is OK, with other settings ``ALREADY_EXISTS``; an inline volume
  (``csi.storage.k8s.io/ephemeral: "true"``) is made at its publish and removed at its
  unpublish;
- ``NodeUnpublishVolume`` / ``NodeUnstageVolume`` of what is not there is OK (idempotent);
  unstaging a volume still published anywhere is a CO's error (``FAILED_PRECONDITION``,
  logged as ``violation``);
- ``NodeGetVolumeStats`` of a path the volume is not published at: ``NOT_FOUND``.
Volumes are folders; staging and publishing are real bind mounts (root), undone by the
inverse calls. A raw block volume (block access type) is a folder holding ``device``, a
symlink to a block device: staging it binds nothing, publishing makes the target a file and
binds the device on it (the spec's "bind-mounting the device file on the publish path").
Every call is appended to the call log (JSON lines: ``call``, ``volume_id``,
``path``, ``code``), the tests' proof of what was called in which order.

Run: ``python tests/support/csidriver.py --name N --endpoint SOCK --registration SOCK
--data DIR --log FILE [--node-id ID] [--no-stage]``; ``CsiDriver`` starts and stops one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from podvisor.services.volumes.mounter import HostMounter, is_mount_point
from podvisor.services.volumes.stubs import csi_pb2 as pb
from podvisor.services.volumes.stubs import csi_pb2_grpc as rpc
from podvisor.services.volumes.stubs import pluginregistration_pb2 as regpb
from podvisor.services.volumes.stubs import pluginregistration_pb2_grpc as regrpc

Code = grpc.StatusCode
EPHEMERAL = "csi.storage.k8s.io/ephemeral"


class Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Driver(rpc.IdentityServicer, rpc.NodeServicer, regrpc.RegistrationServicer):
    def __init__(self, name: str, endpoint: str, data: Path, log: Path, node_id: str,
                 stage: bool) -> None:
        self.name, self.endpoint, self.data, self.log_path = name, endpoint, data, log
        self.node_id, self.stage_caps = node_id, stage
        self.mounter = HostMounter()
        self.lock = threading.Lock()
        self.staged: dict[str, tuple[str, str]] = {}  # volume -> (path, capability)
        self.published: dict[tuple[str, str], str] = {}  # (volume, target) -> settings

    # -- plumbing ------------------------------------------------------------------------------
    def _log(self, call: str, code: str, **fields: Any) -> None:
        with open(self.log_path, "a") as f:
            f.write(json.dumps({"call": call, "code": code, "at": time.time(), **fields}) + "\n")

    def _serve(self, call: str, grpc_context: grpc.ServicerContext, fn: Any,
               **fields: Any) -> Any:
        with self.lock:
            try:
                answer = fn()
            except Abort as err:
                self._log(call, err.code.name, message=err.message, **fields)
                grpc_context.abort(err.code, err.message)
            self._log(call, "OK", **fields)
            return answer

    @staticmethod
    def _need(value: Any, what: str) -> None:
        if not value:
            raise Abort(Code.INVALID_ARGUMENT, f"{what} missing in request")

    def _volume(self, volume_id: str, create: bool = False) -> Path:
        folder = self.data / volume_id
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        if not folder.is_dir():
            raise Abort(Code.NOT_FOUND, f"volume {volume_id} not found")
        return folder

    # -- identity ------------------------------------------------------------------------------
    def GetPluginInfo(self, request: Any, context: Any) -> Any:
        return self._serve("GetPluginInfo", context, lambda: pb.GetPluginInfoResponse(
            name=self.name, vendor_version="0.1.0"))

    def GetPluginCapabilities(self, request: Any, context: Any) -> Any:
        return self._serve("GetPluginCapabilities", context,
                           lambda: pb.GetPluginCapabilitiesResponse())

    def Probe(self, request: Any, context: Any) -> Any:
        return self._serve("Probe", context, lambda: pb.ProbeResponse())

    # -- registration --------------------------------------------------------------------------
    def GetInfo(self, request: Any, context: Any) -> Any:
        return self._serve("GetInfo", context, lambda: regpb.PluginInfo(
            type="CSIPlugin", name=self.name, endpoint=self.endpoint,
            supported_versions=["1.0.0"]))

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        return self._serve("NotifyRegistrationStatus", context,
                           lambda: regpb.RegistrationStatusResponse(),
                           registered=request.plugin_registered, error=request.error)

    # -- node ----------------------------------------------------------------------------------
    def NodeGetInfo(self, request: Any, context: Any) -> Any:
        return self._serve("NodeGetInfo", context, lambda: pb.NodeGetInfoResponse(
            node_id=self.node_id, max_volumes_per_node=16,
            accessible_topology=pb.Topology(segments={"topology.test.csi/node": self.node_id})))

    def NodeGetCapabilities(self, request: Any, context: Any) -> Any:
        types = [pb.NodeServiceCapability.RPC.GET_VOLUME_STATS]
        if self.stage_caps:
            types.append(pb.NodeServiceCapability.RPC.STAGE_UNSTAGE_VOLUME)
        caps = [pb.NodeServiceCapability(rpc=pb.NodeServiceCapability.RPC(type=t))
                for t in types]
        return self._serve("NodeGetCapabilities", context,
                           lambda: pb.NodeGetCapabilitiesResponse(capabilities=caps))

    def NodeStageVolume(self, request: Any, context: Any) -> Any:
        def stage() -> Any:
            if not self.stage_caps:
                raise Abort(Code.UNIMPLEMENTED, "STAGE_UNSTAGE_VOLUME is not offered")
            self._need(request.volume_id, "Volume ID")
            self._need(request.staging_target_path, "Staging target path")
            self._need(request.HasField("volume_capability"), "Volume capability")
            folder = self._volume(request.volume_id)
            path = request.staging_target_path
            if not os.path.isdir(path):
                raise Abort(Code.FAILED_PRECONDITION, f"staging path {path} is not a folder "
                                                      "(the CO makes it)")
            cap = request.volume_capability.SerializeToString(deterministic=True).hex()
            done = self.staged.get(request.volume_id)
            if done is not None:
                if done == (path, cap):
                    return pb.NodeStageVolumeResponse()
                raise Abort(Code.ALREADY_EXISTS, f"volume {request.volume_id} is staged at "
                                                 f"{done[0]} with another capability")
            if not request.volume_capability.HasField("block") and \
                    not is_mount_point(self.mounter, path):
                self.mounter.bind(str(folder), path, False)
            self.staged[request.volume_id] = (path, cap)
            return pb.NodeStageVolumeResponse()
        return self._serve("NodeStageVolume", context, stage, volume_id=request.volume_id,
                           path=request.staging_target_path,
                           context=dict(request.volume_context),
                           publish_context=dict(request.publish_context))

    def NodeUnstageVolume(self, request: Any, context: Any) -> Any:
        def unstage() -> Any:
            self._need(request.volume_id, "Volume ID")
            self._need(request.staging_target_path, "Staging target path")
            self._volume(request.volume_id)
            if any(v == request.volume_id for v, _ in self.published):
                self._log("violation", "FAILED_PRECONDITION", volume_id=request.volume_id,
                          what="unstage while published")
                raise Abort(Code.FAILED_PRECONDITION, "the volume is still published")
            path = request.staging_target_path
            while is_mount_point(self.mounter, path):
                self.mounter.unmount(path)
            self.staged.pop(request.volume_id, None)
            return pb.NodeUnstageVolumeResponse()
        return self._serve("NodeUnstageVolume", context, unstage, volume_id=request.volume_id,
                           path=request.staging_target_path)

    def NodePublishVolume(self, request: Any, context: Any) -> Any:
        def publish() -> Any:
            self._need(request.volume_id, "Volume ID")
            self._need(request.target_path, "Target path")
            self._need(request.HasField("volume_capability"), "Volume capability")
            ephemeral = request.volume_context.get(EPHEMERAL) == "true"
            folder = self._volume(request.volume_id, create=ephemeral)
            source = str(folder)
            if self.stage_caps and not ephemeral:
                if not request.staging_target_path:
                    raise Abort(Code.FAILED_PRECONDITION, "staging target path not set")
                staged = self.staged.get(request.volume_id)
                if staged is None or staged[0] != request.staging_target_path:
                    raise Abort(Code.FAILED_PRECONDITION, f"volume {request.volume_id} is not "
                                f"staged at {request.staging_target_path}")
                source = request.staging_target_path
            target = request.target_path
            if not os.path.isdir(os.path.dirname(target)):
                raise Abort(Code.FAILED_PRECONDITION, f"the parent of {target} does not exist "
                                                      "(the CO makes it)")
            settings = f"{request.readonly}:{request.volume_capability.SerializeToString()!r}"
            done = self.published.get((request.volume_id, target))
            if done is not None:
                if done == settings:
                    return pb.NodePublishVolumeResponse()
                raise Abort(Code.ALREADY_EXISTS, f"{target} is published with other settings")
            if request.volume_capability.HasField("block"):
                source = os.path.realpath(folder / "device")
                if not os.path.exists(source):
                    raise Abort(Code.FAILED_PRECONDITION, f"volume {request.volume_id} has no "
                                                          "block device")
                if not os.path.exists(target):
                    open(target, "w").close()
            else:
                os.makedirs(target, exist_ok=True)
            if not is_mount_point(self.mounter, target):
                self.mounter.bind(source, target, request.readonly)
            self.published[(request.volume_id, target)] = settings
            return pb.NodePublishVolumeResponse()
        return self._serve("NodePublishVolume", context, publish, volume_id=request.volume_id,
                           path=request.target_path, staging=request.staging_target_path,
                           readonly=request.readonly, context=dict(request.volume_context))

    def NodeUnpublishVolume(self, request: Any, context: Any) -> Any:
        def unpublish() -> Any:
            self._need(request.volume_id, "Volume ID")
            self._need(request.target_path, "Target path")
            folder = self._volume(request.volume_id)
            target = request.target_path
            while is_mount_point(self.mounter, target):
                self.mounter.unmount(target)
            if os.path.isdir(target):
                os.rmdir(target)  # the spec: the plugin removes what it made
            elif os.path.isfile(target):
                os.unlink(target)  # a raw block volume's target file
            self.published.pop((request.volume_id, target), None)
            if request.volume_id.startswith("csi-") and not any(
                    v == request.volume_id for v, _ in self.published):
                for child in folder.iterdir():  # an inline volume lives as long as its pod
                    child.unlink() if not child.is_dir() else None
                folder.rmdir() if not any(folder.iterdir()) else None
            return pb.NodeUnpublishVolumeResponse()
        return self._serve("NodeUnpublishVolume", context, unpublish,
                           volume_id=request.volume_id, path=request.target_path)

    def NodeGetVolumeStats(self, request: Any, context: Any) -> Any:
        def stats() -> Any:
            self._need(request.volume_id, "Volume ID")
            self._need(request.volume_path, "Volume path")
            folder = self._volume(request.volume_id)
            if (request.volume_id, request.volume_path) not in self.published:
                raise Abort(Code.NOT_FOUND, f"volume {request.volume_id} is not published at "
                                            f"{request.volume_path}")
            st = os.statvfs(request.volume_path)
            used = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            files = sum(1 for _ in folder.rglob("*")) + 1
            return pb.NodeGetVolumeStatsResponse(usage=[
                pb.VolumeUsage(unit=pb.VolumeUsage.BYTES, used=used,
                               total=st.f_blocks * st.f_frsize,
                               available=st.f_bavail * st.f_frsize),
                pb.VolumeUsage(unit=pb.VolumeUsage.INODES, used=files, total=st.f_files,
                               available=st.f_ffree)])
        return self._serve("NodeGetVolumeStats", context, stats, volume_id=request.volume_id,
                           path=request.volume_path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    for opt in ("--name", "--endpoint", "--registration", "--data", "--log"):
        ap.add_argument(opt, required=True)
    ap.add_argument("--node-id", default="test-node")
    ap.add_argument("--no-stage", action="store_true")
    args = ap.parse_args(argv)
    driver = Driver(args.name, args.endpoint, Path(args.data), Path(args.log), args.node_id,
                    not args.no_stage)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    rpc.add_IdentityServicer_to_server(driver, server)
    rpc.add_NodeServicer_to_server(driver, server)
    server.add_insecure_port(f"unix://{args.endpoint}")
    reg = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    regrpc.add_RegistrationServicer_to_server(driver, reg)
    reg.add_insecure_port(f"unix://{args.registration}")
    server.start()
    reg.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("ready", flush=True)
    stop.wait()
    reg.stop(0)
    server.stop(0)
    for path in (args.registration, args.endpoint):
        if os.path.exists(path):
            os.unlink(path)


class CsiDriver:
    """The driver as a child process of the test (stopped by PID)."""

    def __init__(self, name: str, root: Path, registry: Path, stage: bool = True) -> None:
        self.name = name
        self.root = root
        self.data = root / "volumes"
        self.log = root / "calls.jsonl"
        self.endpoint = root / "csi.sock"
        self.registration = registry / f"{name}-reg.sock"
        self.data.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, __file__, "--name", name, "--endpoint", str(self.endpoint),
                "--registration", str(self.registration), "--data", str(self.data),
                "--log", str(self.log), *(() if stage else ("--no-stage",))]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the test CSI driver did not start: {line!r}")

    def calls(self, *names: str) -> list[dict[str, Any]]:
        try:
            lines = self.log.read_text().splitlines()
        except OSError:
            return []
        out = [json.loads(line) for line in lines]
        return [c for c in out if not names or c["call"] in names]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main()
