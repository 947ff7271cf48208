"""SyncPod: read the pod's runtime state fresh from CRI (or take it from the stream event that
triggered the sync, when safe: ``runtime_events``), compute the actions, carry them out.

Thin effects over ``compute_pod_actions`` and the ``cri_config`` builders. Errors of one
container do not stop the others (regular containers); every error is reported in the result,
and the worker requeues the pod after the error delay. Runs on a worker thread: everything it
touches (CRI client, shared back-off, logger) is thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from cri_api.v1 import api_pb2 as pb

from podvisor.common.logs import Log
from podvisor.services.cri import CriError, RuntimeClient
from podvisor.services.pod import Container, Pod, PullPolicy
from podvisor.services.syncloop import cri_config, volumes
from podvisor.services.syncloop.actions import (
    PodActions,
    StartAction,
    Waiting,
    compute_pod_actions,
)
from podvisor.services.syncloop.backoff import SharedBackoff
from podvisor.services.syncloop.podcache import ImagePresence, RuntimeCache
from podvisor.services.syncloop.podcgroups import PodCgroups
from podvisor.services.syncloop.runtime_events import (
    Effect,
    Effects,
    EventSnapshot,
    runtime_from_event,
)
from podvisor.services.syncloop.runtime_state import (
    ContainerState,
    PodRuntime,
    pod_runtime,
    read_pod_runtime,
)
from podvisor.services.syncloop.terminate import kill_containers

IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
ERR_IMAGE_PULL = "ErrImagePull"
ERR_IMAGE_NEVER_PULL = "ErrImageNeverPull"
CREATE_CONTAINER_ERROR = "CreateContainerError"
RUN_CONTAINER_ERROR = "RunContainerError"
KEEP_DEAD_PER_CONTAINER = 1


@dataclass(frozen=True)
class SyncDeps:
    cri: RuntimeClient
    pods_dir: Path
    pod_logs_dir: Path
    backoff: SharedBackoff
    image_backoff: SharedBackoff
    mono: Callable[[], float]
    wall: Callable[[], float]
    log: Log
    sleep: Callable[[float], None]
    cgroups: PodCgroups | None = None  # None: no cgroup_parent, no cleanup (cgroupRoot: "")
    cache: RuntimeCache | None = None  # a listing shared by workers; None: always read fresh
    images: ImagePresence | None = None  # None: ImageStatus before every start


@dataclass(frozen=True)
class SyncResult:
    ok: bool
    errors: tuple[str, ...] = ()
    waiting: Mapping[str, Waiting] = field(default_factory=dict)
    sandbox_id: str | None = None
    retry_after: float | None = None
    pod_failed: bool = False
    effects: Effects = field(default_factory=dict)  # container ID -> what this sync did
    acted: bool = False  # it called the runtime to change something


def _seed_backoff(deps: SyncDeps, pod: Pod, rt: PodRuntime) -> None:
    for c in pod.all_containers():
        latest = rt.latest(c.name)
        if latest is not None and latest.started_at > 0:
            deps.backoff.seed((pod.uid, c.name), latest.restart_count, latest.started_at)


class _Run:
    """One SyncPod execution: the pod, its actions, and what happened."""

    def __init__(self, deps: SyncDeps, pod: Pod, actions: PodActions) -> None:
        self.deps, self.pod, self.actions = deps, pod, actions
        self.errors: list[str] = []
        self.waiting: dict[str, Waiting] = dict(actions.waiting)
        self.sandbox_id = actions.sandbox_id
        parent = deps.cgroups.parent(pod.uid) if deps.cgroups is not None else ""
        self.sandbox_cfg = cri_config.sandbox_config(pod, actions.attempt, deps.pod_logs_dir,
                                                     parent)
        self.retry_after = actions.retry_after
        self.effects: dict[str, Effect] = {}
        self.from_event = False  # the runtime state came from a stream event (for the log)

    def fail(self, name: str, reason: str, message: str) -> None:
        self.waiting[name] = Waiting(reason, message)
        self.errors.append(f"{name}: {reason}: {message}")
        self.deps.log.warning("syncloop.container.error", pod=self.pod.full_name,
                              pod_uid=self.pod.uid, container=name, reason=reason,
                              message=message)

    def create_sandbox(self) -> bool:
        """False (and the errors recorded) when a volume could not be set up: no sandbox then,
        and the worker retries after its error delay, as the kubelet's volume manager does."""
        failed = volumes.setup_volumes(self.pod, self.deps.pods_dir)
        for name, why in failed.items():
            message = f'MountVolume.SetUp failed for volume "{name}" : {why}'
            self.errors.append(message)
            self.deps.log.warning("syncloop.volume.failed", pod=self.pod.full_name,
                                  pod_uid=self.pod.uid, volume=name, message=message)
        if failed:
            return False
        log_dir = Path(self.sandbox_cfg.log_directory)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.sandbox_id = self.deps.cri.run_pod_sandbox(self.sandbox_cfg)
        self.deps.log.info("syncloop.sandbox.created", pod=self.pod.full_name,
                           pod_uid=self.pod.uid, sandbox_id=self.sandbox_id,
                           attempt=self.actions.attempt)
        return True

    def ensure_image(self, c: Container) -> bool:
        deps, key = self.deps, (self.pod.uid, "image:" + c.name)
        present = c.image_pull_policy is not PullPolicy.ALWAYS and (
            deps.images.present(c.image) if deps.images is not None
            else deps.cri.image_status(c.image) is not None)
        if present:
            return True
        if c.image_pull_policy is PullPolicy.NEVER:
            self.fail(c.name, ERR_IMAGE_NEVER_PULL,
                      f'image "{c.image}" is not present with pull policy of Never')
            return False
        entry = deps.image_backoff.entry(key)
        now = deps.mono()
        if entry is not None:
            left = deps.image_backoff.remaining(key, entry.last_update, now)
            if left > 0:
                self.waiting[c.name] = Waiting(IMAGE_PULL_BACK_OFF,
                                               f'Back-off pulling image "{c.image}"')
                self.retry_after = min(self.retry_after or left, left)
                return False
        try:
            deps.cri.pull_image(c.image, self.sandbox_cfg)
        except CriError as err:
            deps.image_backoff.record_restart(key, now, now)
            self.fail(c.name, ERR_IMAGE_PULL, err.message)
            return False
        deps.image_backoff.forget_key(key)
        return True

    def start(self, action: StartAction, spec: Container) -> bool:
        deps = self.deps
        if not self.ensure_image(spec):
            return False
        volumes = cri_config.volume_paths(self.pod, deps.pods_dir)
        try:
            config = cri_config.container_config(self.pod, spec, action.restart_count, volumes)
        except KeyError as err:
            self.fail(spec.name, CREATE_CONTAINER_ERROR, f"volume {err} not found")
            return False
        if action.previous_finished_at > 0:
            deps.backoff.record_restart((self.pod.uid, spec.name), action.previous_finished_at,
                                        deps.mono())
        try:
            cid = deps.cri.create_container(self.sandbox_id, config, self.sandbox_cfg)
        except CriError as err:
            if deps.images is not None:
                deps.images.forget(spec.image)
            self.fail(spec.name, CREATE_CONTAINER_ERROR, err.message)
            return False
        self.effects[cid] = Effect.STARTED
        try:
            deps.cri.start_container(cid)
        except CriError as err:
            self.fail(spec.name, RUN_CONTAINER_ERROR, err.message)
            return False
        self.waiting.pop(spec.name, None)
        deps.log.info("syncloop.container.started", pod=self.pod.full_name, pod_uid=self.pod.uid,
                      container=spec.name, container_id=cid, restart_count=action.restart_count,
                      state_from_event=self.from_event)
        return True


def _prune_dead(deps: SyncDeps, rt: PodRuntime, names: Collection[str],
                effects: dict[str, Effect]) -> None:
    """Remove exited containers of ``names`` beyond the newest dead one (container GC)."""
    dead_seen: dict[str, int] = {}
    for c in rt.containers:
        if c.name not in names or c.state is ContainerState.RUNNING:
            continue
        dead_seen[c.name] = dead_seen.get(c.name, 0) + 1
        if dead_seen[c.name] > KEEP_DEAD_PER_CONTAINER:
            try:
                deps.cri.remove_container(c.id)
                effects[c.id] = Effect.REMOVED
            except CriError as err:
                deps.log.warning("syncloop.container.remove_failed", container_id=c.id,
                                 error=err.message)


def execute(deps: SyncDeps, pod: Pod, rt: PodRuntime, actions: PodActions,
            from_event: bool = False) -> SyncResult:
    run = _Run(deps, pod, actions)
    run.from_event = from_event
    grace = pod.spec.termination_grace_period_seconds
    if actions.kill_pod:
        kill_containers(deps.cri, deps.log, pod, rt.running(), grace, deps.sleep, deps.mono)
        run.effects.update((c.id, Effect.STOPPED) for c in rt.running())
        for s in rt.sandboxes:
            if s.ready:
                deps.cri.stop_pod_sandbox(s.id)
    if actions.kill:
        ids = {k.container_id for k in actions.kill}
        victims = tuple(c for c in rt.containers if c.id in ids)
        kill_containers(deps.cri, deps.log, pod, victims, grace, deps.sleep, deps.mono)
        run.effects.update((c.id, Effect.STOPPED) for c in victims)
    if not actions.create_sandbox or run.create_sandbox():
        specs = {c.name: c for c in pod.all_containers()}
        _prune_dead(deps, rt, [a.name for a in actions.start], run.effects)
        for action in actions.start:
            if not run.start(action, specs[action.name]) and action.init:
                break
    return SyncResult(ok=not run.errors, errors=tuple(run.errors), waiting=run.waiting,
                      sandbox_id=run.sandbox_id or None, retry_after=run.retry_after,
                      pod_failed=actions.pod_failed, effects=run.effects, acted=True)


def read_runtime(deps: SyncDeps, uid: str, newer_than: float | None) -> PodRuntime:
    """The pod's runtime state: fresh (``newer_than`` None) or from the shared listing when it
    started at or after ``newer_than``. The status of a running container is read only when
    its crash back-off entry must be rebuilt from its start time (after a sync loop restart)."""

    def running_status(name: str, restart_count: int) -> bool:
        return restart_count > 0 and deps.backoff.entry((uid, name)) is None

    if newer_than is None or deps.cache is None:
        return read_pod_runtime(deps.cri, uid, deps.mono, deps.wall, running_status)
    return deps.cache.pod(uid, newer_than, running_status)


def _event_runtime(deps: SyncDeps, pod: Pod, snapshot: EventSnapshot) -> PodRuntime | None:
    names = [c.name for c in pod.all_containers()]
    rt, why = runtime_from_event(snapshot, names, deps.mono(), deps.wall())
    if rt is None:
        deps.log.debug("syncloop.pod.event_state_unused", pod_uid=pod.uid, reason=why)
    return rt


class _WouldCall(Exception):
    """A quiet resync needed a CRI call: it goes to a pool thread instead."""


class _NoCalls:
    """The CRI client of a quiet resync: any call means "not quiet"."""

    def container_status(self, container_id: str) -> pb.ContainerStatus:
        raise _WouldCall


_NO_CALLS: RuntimeClient = cast(RuntimeClient, _NoCalls())


def quiet_resync(deps: SyncDeps, pod: Pod, liveness_failed: Collection[str],
                 newer_than: float) -> SyncResult | None:
    """A SyncPod that needs no CRI call, on the caller's (the loop's) thread: the shared listing
    is usable for ``newer_than`` as it is, no ContainerStatus is needed and the actions are
    none. The kubelet's periodic resync of a running pod, without two thread hand-offs. None:
    it needs the runtime, hand it to a pool thread (``sync_pod``)."""
    if deps.cache is None:
        return None
    listing = deps.cache.peek(pod.uid, newer_than)
    if listing is None:
        return None
    uid = pod.uid

    def running_status(name: str, restart_count: int) -> bool:
        return restart_count > 0 and deps.backoff.entry((uid, name)) is None

    try:
        rt = pod_runtime(_NO_CALLS, listing[0], listing[1], deps.mono, deps.wall,
                         running_status)
    except _WouldCall:
        return None
    actions = compute_pod_actions(pod, rt, deps.mono(), deps.backoff, liveness_failed)
    if not actions.noop:
        return None
    return SyncResult(ok=True, waiting=actions.waiting,
                      sandbox_id=rt.sandboxes[0].id if rt.sandboxes else None,
                      retry_after=actions.retry_after, pod_failed=actions.pod_failed)


def sync_pod(deps: SyncDeps, pod: Pod, liveness_failed: Collection[str] = (),
             newer_than: float | None = None,
             snapshot: EventSnapshot | None = None) -> SyncResult:
    """One SyncPod. Raises CriError when the runtime cannot be read or a pod-level call fails.
    ``newer_than``: see ``read_runtime``; ``snapshot``: the triggering event, used as the
    runtime state when ``runtime_from_event`` allows it."""
    rt = _event_runtime(deps, pod, snapshot) if snapshot is not None else None
    from_event = rt is not None
    if rt is None:
        rt = read_runtime(deps, pod.uid, newer_than)
    _seed_backoff(deps, pod, rt)
    actions = compute_pod_actions(pod, rt, deps.mono(), deps.backoff, liveness_failed)
    if actions.noop:
        sandbox = rt.sandboxes[0].id if rt.sandboxes else None
        return SyncResult(ok=True, waiting=actions.waiting, sandbox_id=sandbox,
                          retry_after=actions.retry_after, pod_failed=actions.pod_failed)
    deps.log.debug("syncloop.pod.actions", pod=pod.full_name, pod_uid=pod.uid,
                   kill_pod=actions.kill_pod, create_sandbox=actions.create_sandbox,
                   kill=[k.name for k in actions.kill], start=[s.name for s in actions.start])
    return execute(deps, pod, rt, actions, from_event)
