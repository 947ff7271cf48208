"""The volume manager: the desired state of the world (pods the sync loop wants, their
volumes resolved), the actual state (reconstructed at start, kept by the operations) and the
reconciler's pass over both. Runs on the volumes process's worker thread (``step``); the
service loop hands it the pods and publishes what it returns.

Per pass: the plugin folders are scanned (CSI and FlexVolume drivers come and go); pods new or
changed, and pods whose volumes failed to resolve, are resolved; ``state.plan`` gives the
steps; each runs unless its volume backs off (0.5 s doubling to 2 min 2 s after a failure, as
the kubelet's pending operations); every ``stats_period`` the mounted volumes' usage is read
(a volume just mounted at once). What it returns: each wanted pod's ``PodVolumes`` (ready,
host path, or why not) and the node's ``NodeVolumes``. Failures are logged and recorded as the
kubelet's events (FailedMount, FailedAttachVolume) on the pod.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from podvisor.common.logs import Log
from podvisor.ipc.volumemaps import (
    AttachedVolume,
    MountedVolume,
    NodeVolumes,
    PodVolumes,
    VolumeStats,
)
from podvisor.services.pod import Pod
from podvisor.services.volumes.csiclient import CsiError
from podvisor.services.volumes.flexvolume import FlexDrivers
from podvisor.services.volumes.operations import Operations, OpFailed
from podvisor.services.volumes.reconstruct import reconstruct
from podvisor.services.volumes.registration import Registry
from podvisor.services.volumes.resolve import Resolver
from podvisor.services.volumes.spec import Plugin, PodWants, VolumePaths, VolumeSpec
from podvisor.services.volumes.state import ActualState, Mounted, MountKey, Op, Step, plan

BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 122.0
PASS = 1.0  # the plugin folder's relist; retries of what failed to resolve


@dataclass
class _Backoff:
    delay: float
    until: float


@dataclass
class Outcome:
    """What a pass leaves to publish: pod UID -> its volumes, and the node's."""

    pods: dict[str, PodVolumes] = field(default_factory=dict)
    node: NodeVolumes = field(default_factory=NodeVolumes)
    next_at: float | None = None


Record = Callable[[str, str, Mapping[str, Any]], None]  # reason, message, pod object


class VolumeManager:
    def __init__(self, paths: VolumePaths, resolver: Resolver | None, ops: Operations,
                 registry: Registry | None, log: Log, record: Record,
                 wall: Callable[[], float], stats_period: float = 60.0,
                 flex: FlexDrivers | None = None) -> None:
        self.paths = paths
        self.flex = flex
        self.resolver = resolver
        self.ops = ops
        self.registry = registry
        self.log = log
        self.record = record
        self.wall = wall
        self.stats_period = stats_period
        self.actual = ActualState()
        self.wants: dict[str, PodWants] = {}
        self._pods: dict[str, Pod] = {}
        self._errors: dict[tuple[str, str], tuple[str, str]] = {}  # (uid, volume) -> why
        self._backoff: dict[str, _Backoff] = {}
        self._stats: dict[tuple[str, str], VolumeStats] = {}
        self._next_stats = 0.0
        self.started = False

    def start(self) -> None:
        if self.flex is not None:
            self.flex.probe()  # first: the drivers' folders are reconstructed
        self.actual = reconstruct(self.paths, lambda event, **f: self.log.info(event, **f),
                                  self.flex.folders() if self.flex is not None else None)
        self.started = True

    # -- the desired state -----------------------------------------------------------------
    def _populate(self, pods: Mapping[str, Pod]) -> None:
        if self.resolver is not None:
            self.resolver.new_pass()
        for uid in list(self.wants):
            if uid not in pods:
                del self.wants[uid]
                self._pods.pop(uid, None)
                self._errors = {k: v for k, v in self._errors.items() if k[0] != uid}
        for uid, pod in pods.items():
            known = self.wants.get(uid)
            if known is not None and self._pods.get(uid) is pod and not known.failures:
                continue
            if self.resolver is None:
                continue
            wants = self.resolver.pod(pod)
            self.wants[uid], self._pods[uid] = wants, pod
            for failure in wants.failures:
                self._fail(uid, pod, failure.volume, "FailedMount", failure.message)

    def desired(self) -> dict[MountKey, VolumeSpec]:
        return {MountKey.of(s): s for w in self.wants.values() for s in w.specs}

    # -- the pass ----------------------------------------------------------------------------
    def step(self, now: float, pods: Mapping[str, Pod], synced: bool) -> Outcome:
        """One reconciler pass. ``pods``: the pods whose volumes are wanted (admitted, not
        terminating before they mounted); ``synced``: the sync loop's map is complete."""
        if not self.started:
            self.start()
        if self.registry is not None:
            try:
                if self.registry.scan(now):
                    self._backoff.clear()  # a driver came or went: retry its volumes now
            except OSError as err:
                self.log.warning("volumes.registry.failed", error=str(err))
        if self.flex is not None and self.flex.probe():
            self._backoff.clear()  # a FlexVolume driver came, went or changed
        self._populate(pods)
        desired = self.desired()
        for step in plan(desired, self.actual, synced):
            self._run(step, now)
        due = now >= self._next_stats
        if due:
            self._next_stats = now + self.stats_period
        self._read_stats(desired, every=due)  # else only volumes mounted since the last
        return self._outcome(now, synced, desired)

    def _key(self, step: Step) -> str:
        if step.op in (Op.MOUNT, Op.UNMOUNT) and step.key is not None:
            return f"{step.op}:{step.key.pod_uid}/{step.key.plugin}/{step.key.spec_name}"
        return f"{step.op}:{step.device.unique_name}"

    def _run(self, step: Step, now: float) -> None:
        key = self._key(step)
        backoff = self._backoff.get(key)
        if backoff is not None and now < backoff.until:
            return
        try:
            self.ops.run(step, self.actual)
        except (OpFailed, CsiError, OSError) as err:
            reason = err.reason if isinstance(err, OpFailed) else "FailedMount"
            message = err.message if isinstance(err, OpFailed) else str(err)
            delay = BACKOFF_INITIAL if backoff is None else min(backoff.delay * 2, BACKOFF_MAX)
            self._backoff[key] = _Backoff(delay, now + delay)
            self.log.warning("volumes.operation.failed", op=str(step.op), message=message,
                             retry_in=delay, **self._fields(step))
            if step.spec is not None:
                pod = self._pods.get(step.spec.pod_uid)
                self._fail(step.spec.pod_uid, pod, step.spec.volume, reason, message)
            return
        self._backoff.pop(key, None)
        if step.spec is not None:  # past what failed: its reason no longer holds
            self._errors.pop((step.spec.pod_uid, step.spec.volume), None)
        self.log.info(f"volumes.{step.op}", **self._fields(step))

    @staticmethod
    def _fields(step: Step) -> dict[str, str]:
        out = {"volume": step.device.unique_name}
        if step.spec is not None:
            out.update(pod=f"{step.spec.pod_name}_{step.spec.pod_namespace}",
                       pod_uid=step.spec.pod_uid, volume=step.spec.volume)
        elif step.key is not None:
            out.update(pod_uid=step.key.pod_uid, volume=step.key.spec_name)
        return out

    def _fail(self, uid: str, pod: Pod | None, volume: str, reason: str, message: str) -> None:
        """Say why a volume is not ready: logged and recorded as an event when it is new (a
        failure that keeps happening is shown once, as the event correlator would count it)."""
        before = self._errors.get((uid, volume))
        self._errors[(uid, volume)] = (reason, message)
        if before == (reason, message):
            return
        if reason and pod is not None:
            self.record(reason, message, {"kind": "Pod", "uid": uid, "name": pod.name,
                                          "namespace": pod.namespace})
        self.log.warning("volumes.volume.not_ready", pod=f"{pod.name}_{pod.namespace}"
                             if pod is not None else "", pod_uid=uid, volume=volume,
                             reason=reason, message=message)

    # -- what is published -----------------------------------------------------------------
    def _outcome(self, now: float, synced: bool,
                 desired: Mapping[MountKey, VolumeSpec]) -> Outcome:
        out = Outcome()
        pending = False
        for uid, wants in self.wants.items():
            volumes: dict[str, MountedVolume] = {}
            for spec in wants.specs:
                ready = self.actual.mounted(spec)
                if ready:
                    self._errors.pop((uid, spec.volume), None)
                reason, message = self._errors.get((uid, spec.volume), ("", ""))
                if not ready and not message:
                    message = "waiting for the volume to be attached and mounted"
                pending = pending or not ready
                volumes[spec.volume] = MountedVolume(
                    spec.volume, ready, str(self.paths.target(spec)) if ready else "",
                    spec.read_only, spec.unique_name, spec.claim, reason if not ready else "",
                    message if not ready else "", self._stats.get((uid, spec.volume)),
                    spec.block)
            for failure in wants.failures:
                pending = True
                reason, message = self._errors.get((uid, failure.volume),
                                                   ("FailedMount", failure.message))
                volumes[failure.volume] = MountedVolume(failure.volume, reason=reason,
                                                        message=message)
            out.pods[uid] = PodVolumes(wants.name, wants.namespace, volumes)
        in_use = sorted({s.unique_name for s in desired.values() if s.attachable}
                        | {d.device.unique_name for d in self.actual.devices.values()
                           if d.attached})
        attached = tuple(AttachedVolume(d.device.unique_name)
                         for _, d in sorted(self.actual.devices.items()) if d.attached)
        out.node = NodeVolumes(synced, tuple(in_use), attached)
        waits = [now + PASS] if (pending or self.registry is not None or self._teardown_left())\
            else []
        waits += [b.until for b in self._backoff.values()]
        waits.append(self._next_stats)
        out.next_at = min(waits) if waits else None
        return out

    def _teardown_left(self) -> bool:
        desired = self.desired()
        return any(k not in desired for k in self.actual.mounts) or any(
            d.staged is not Mounted.NO or d.device.attach_id for d in self.actual.devices.values()
            if d.device.unique_name not in {s.unique_name for s in desired.values()})

    # -- usage --------------------------------------------------------------------------------
    def _read_stats(self, desired: Mapping[MountKey, VolumeSpec], every: bool) -> None:
        """The usage of every mounted volume (``every``), or of those with no reading yet."""
        stats: dict[tuple[str, str], VolumeStats] = {}
        for key, spec in desired.items():
            if not self.actual.mounted(spec) or spec.block:  # a device: no file system
                continue
            if not every and (known := self._stats.get((spec.pod_uid, spec.volume))):
                stats[(spec.pod_uid, spec.volume)] = known
                continue
            try:
                usage = self._usage(spec)
            except (CsiError, LookupError, OSError) as err:
                self.log.debug("volumes.stats.failed", pod_uid=key.pod_uid, volume=spec.volume,
                               error=str(err))
                continue
            if usage is not None:
                stats[(spec.pod_uid, spec.volume)] = usage
        self._stats = stats

    def _usage(self, spec: VolumeSpec) -> VolumeStats | None:
        target = str(self.paths.target(spec))
        if spec.plugin is Plugin.CSI and spec.csi is not None and self.registry is not None:
            client = self.registry.client(spec.csi.source.driver)
            staging = str(self.paths.staging(spec.csi.source.driver, spec.csi.source.handle)) \
                if spec.device_mountable and client.stages() else ""
            got = client.volume_stats(spec.csi.source.handle, target, staging, self.wall())
            if got is not None:
                return got
        return disk_usage(target, self.wall())


def disk_usage(path: str, now: float) -> VolumeStats:
    """statvfs of the file system plus the bytes and inodes under ``path`` (the kubelet's
    ``du``-style ``MetricsDu`` for hostPath/local: used = what the volume holds)."""
    st = os.statvfs(path)
    used = inodes_used = 0
    for base, _dirs, files in os.walk(path):
        inodes_used += 1 + len(files)
        for name in files:
            try:
                used += os.lstat(os.path.join(base, name)).st_blocks * 512
            except OSError:
                continue
    return VolumeStats(now, used, st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize,
                       st.f_files, st.f_ffree, inodes_used)
