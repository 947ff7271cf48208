"""The volumes process: ``VolumeService`` wires the ``desired`` replica (the pods the sync loop
wants), the ``volumes`` map it owns and the volume manager, which runs on the service loop's
worker (mounts and CSI calls block: a call that hangs past ``STALL`` is a hung process, which
the supervisor restarts; the restart reconstructs the mounts from the node).

A pod's volumes are wanted while its ``desired`` entry is there and admitted; a pod first
seen terminating gets none (as the kubelet's populator skips it), and one that goes from the
map (its containers are gone: the sync loop's termination is done) has its volumes unmounted.
Nothing is unmounted before the ``desired`` replica has synced (``NodeVolumes.synced``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from podvisor.common import crashpoints
from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop
from podvisor.ipc.maps import DESIRED, VOLUMES, DesiredPod
from podvisor.ipc.volumemaps import NODE_KEY
from podvisor.services.apiserver import ApiConnection
from podvisor.services.events import EventPublisher, Recorder
from podvisor.services.pod import PLUGIN_KINDS, Pod, PodValidationError, pod_from_wire
from podvisor.services.volumes.apiclient import VolumeApi
from podvisor.services.volumes.flexvolume import FlexDrivers
from podvisor.services.volumes.hostexec import HostRunner
from podvisor.services.volumes.manager import Outcome, VolumeManager
from podvisor.services.volumes.mounter import HostMounter
from podvisor.services.volumes.netplugins import HostDevices
from podvisor.services.volumes.operations import Operations
from podvisor.services.volumes.pluginops import PluginMounts
from podvisor.services.volumes.registration import Registry
from podvisor.services.volumes.resolve import Resolver
from podvisor.services.volumes.spec import VolumePaths

STALL = 300.0  # longer than two CSI calls' deadlines (2 min each)


class VolumeService:
    def __init__(self, ctx: ChildContext) -> None:
        cfg, clock = ctx.config, ctx.clock
        self.ctx = ctx
        self.loop = ServiceLoop(ctx)
        self.publisher = self.loop.publisher()
        self.owner = self.loop.owner(self.publisher, VOLUMES)
        self.events = Recorder(ctx.name, clock.wall)
        self.event_pub = EventPublisher(ctx.zctx, ctx.paths, ctx.name, clock=clock)
        self.api: VolumeApi | None = None
        if cfg.kubeconfig:
            conn = ApiConnection(cfg.kubeconfig, "volumes")
            self.loop.on_faults(conn.faults.set)  # injected api faults (issue 28)
            self.api = VolumeApi(conn)
        paths = VolumePaths(ctx.paths.root)
        paths.registry.mkdir(parents=True, exist_ok=True)
        node = cfg.node_name
        self.registry = Registry(paths.registry, node, self.api, ctx.log.info)
        mounter, runner = HostMounter(), HostRunner()
        flex = FlexDrivers(Path(cfg.volume_plugin_dir), runner, ctx.log.info)
        plugins = PluginMounts(paths, mounter, runner, flex,
                               HostDevices(lambda s: not ctx.stop.wait(s)), ctx.log.info)
        ops = Operations(paths, mounter, self.registry, self.api, node,
                         crashpoints.from_env("volumes"), ctx.log.info, plugins)
        self.manager = VolumeManager(
            paths, Resolver(self.api, node), ops, self.registry, ctx.log,
            lambda reason, message, obj: self.events.record("Warning", reason, message, obj),
            clock.wall, cfg.volume_stats_agg_period, flex)
        self._lock = threading.Lock()
        self._pods: dict[str, Pod] = {}  # the loop's thread writes, the worker reads a copy
        self._wire: dict[str, dict[str, Any]] = {}
        self.desired = self.loop.replica(DESIRED, self._on_desired)
        self.worker = self.loop.worker(self._work, stall=STALL, name="volumes",
                                       deliver=self._publish)

    # -- the loop's thread ---------------------------------------------------------------------
    def _on_desired(self, key: str, old: object, new: object) -> None:
        with self._lock:
            if not isinstance(new, DesiredPod) or not new.admitted or not _mounts(new):
                self._pods.pop(key, None)
                self._wire.pop(key, None)
            elif (new.worker == "syncing" or key in self._pods) and \
                    self._wire.get(key) != new.pod:
                try:
                    self._pods[key] = pod_from_wire(new.pod, where="desired")
                    self._wire[key] = new.pod
                except PodValidationError as err:
                    self.ctx.log.error("volumes.pod.invalid", pod_uid=key, error=err.summary())
        self.worker.wake()

    def _publish(self, outcome: Outcome) -> None:
        for uid in set(self.owner.items()) - set(outcome.pods) - {NODE_KEY}:
            self.owner.delete(uid)
        for uid, value in outcome.pods.items():
            self.owner.set(uid, value)
        self.owner.set(NODE_KEY, outcome.node)

    def step(self, now: float) -> float | None:
        self.events.flush(self.event_pub)
        return now + 1.0

    # -- the worker's thread -------------------------------------------------------------------
    def _work(self, now: float) -> float | None:
        with self._lock:
            pods = dict(self._pods)
        outcome = self.manager.step(now, pods, self.desired.synced)
        self.worker.put(outcome)
        return outcome.next_at

    def run(self) -> None:
        self.ctx.log.info("volumes.started", node=self.ctx.config.node_name)
        self.loop.run(self.step)

    def close(self) -> None:
        self.loop.close()
        self.registry.close()
        self.event_pub.close()
        if self.api is not None:
            self.api.close()


def _mounts(value: DesiredPod) -> bool:
    """Whether the pod has a volume the volume manager mounts (read off its wire form)."""
    spec = value.pod.get("spec")
    volumes = spec.get("volumes") if isinstance(spec, dict) else None
    return any(isinstance(v, dict) and any(k in v for k in _MOUNTED) for v in volumes or ())


_MOUNTED = ("persistentVolumeClaim", "ephemeral", "csi", *PLUGIN_KINDS)
