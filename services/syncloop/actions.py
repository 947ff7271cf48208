"""``compute_pod_actions``: what SyncPod must do to move a pod's runtime state toward its spec.

A pure function (no I/O, no clock: ``now`` is given), after the kubelet's
``kuberuntime_manager.computePodActions`` plus its crash back-off (``doBackOff``):

- Recreate the sandbox when there is none, the newest is not ready, or several are ready; a new
  sandbox kills every container and starts over from the first init container (containers that
  succeeded under restartPolicy OnFailure, or any under Never, are not run again). Its attempt
  is one more than the largest attempt of every sandbox the runtime lists for the pod (a
  sandbox whose creation failed half-way keeps its name reserved in containerd).
- Remove not-ready sandboxes that hold no container (one whose network setup failed, or one
  being replaced), each unless its stop is backing off (``sandbox_wait``): the kubelet's
  sandbox garbage collection, done by the pod's own sync.
- Kill running containers whose spec hash changed, whose liveness probe failed, or that no
  longer appear in the spec.
- Ephemeral containers (``kubectl debug``) that have no runtime container yet are started
  first (SyncPod step 5), even before initialization is done; they are never restarted and
  never disturb the others.
- Init containers run one at a time in order; the next starts only after the previous exited 0.
  A failed init container restarts unless restartPolicy is Never, which fails the pod. A pod
  with sidecars (init containers with ``restartPolicy: Always``) takes the kubelet's sidecar
  path instead (``initactions.sidecar_actions``): sidecars start in order and stay running,
  restarted whatever the pod's policy.
- Then every regular container; a stopped one restarts by policy (Always: yes; OnFailure: if the
  exit code != 0; Never: no). When no regular container runs or is to start, the pod is
  killed (sidecars too).
- A failed pod (the sync loop tells: past ``activeDeadlineSeconds``, or failed by another
  subsystem through ``SyncLoop.fail_pod``): every container is stopped and nothing starts again.
- A restart waits out the crash back-off of its (pod uid, container name); meanwhile the
  container is reported waiting with reason ``CrashLoopBackOff``.
- A container created in the current sandbox with the current spec and never started (the
  sync that created it, or the runtime, died before StartContainer was answered) is started
  as it is, with no back-off and no new attempt. The kubelet creates attempt + 1 beside it
  instead; podvisor's retry is idempotent, so a crash of the sync loop or of the runtime
  counts no restart and leaves no second container of one attempt (docs/ARCHITECTURE.md,
  "Exactly once").
- A container whose attempt was lost (``lost_attempt``: containerd's CreateContainer or
  StartContainer interrupted by the sync loop, its caller, going away or by containerd's own
  crash, or failed by containerd itself) never ran, and not by its own doing: that is no
  failure of the pod. It is removed and the same attempt created again in its place, under
  every restart policy, with no back-off and no restart counted (the kubelet kills or leaves
  it and counts a restart).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from podvisor.services.pod import Container, Pod, RestartPolicy
from podvisor.services.syncloop.attempts import lost_attempt
from podvisor.services.syncloop.backoff import BackoffKey
from podvisor.services.syncloop.initactions import (
    LIVENESS_FAILED,
    RESIZE_RESTART,
    SPEC_CHANGED,
    STARTUP_FAILED,
    next_init,
    sidecar_actions,
)
from podvisor.services.syncloop.runtime_state import ContainerInfo, ContainerState, PodRuntime
from podvisor.services.syncloop.spec import container_hash, same_spec

CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
POD_INITIALIZING = "PodInitializing"


def _died_under(c: ContainerInfo, rt: PodRuntime) -> bool:
    """``c`` was created, never started, in a sandbox the runtime lists not ready: it can never
    start there, and its attempt is lost too (containerd killed mid-burst: a sandbox whose
    container was created just before the crash comes back NOTREADY; a new sandbox replaces
    it, and the container is made again in that one as the same attempt)."""
    return c.state is ContainerState.CREATED and any(
        s.id == c.sandbox_id and not s.ready for s in rt.sandboxes)


class BackoffView(Protocol):
    def remaining(self, key: BackoffKey, finished_at: float, now: float) -> float: ...


@dataclass(frozen=True)
class Waiting:
    reason: str
    message: str = ""


@dataclass(frozen=True)
class KillAction:
    container_id: str
    name: str
    reason: str


@dataclass(frozen=True)
class StartAction:
    name: str
    init: bool
    restart_count: int
    previous_finished_at: float = 0.0  # monotonic; 0 = first start, no back-off to record
    # a container of this spec already created in the current sandbox and never started (its
    # StartContainer, or the answer to it, was lost): start that one, create none
    container_id: str = ""
    ephemeral: bool = False  # an ephemeral container (started first, never restarted)
    sidecar: bool = False  # a restartable init container: a failed start does not stop the rest
    # a container whose attempt was lost (``lost_attempt``): remove it first, then
    # create this attempt again in its place (it holds the attempt's name)
    replaces: str = ""


@dataclass(frozen=True)
class PodActions:
    kill_pod: bool = False          # stop every container and the sandbox(es) first
    create_sandbox: bool = False
    sandbox_id: str = ""            # the sandbox to start containers in (when not created)
    attempt: int = 0                # the new sandbox's attempt number
    kill: tuple[KillAction, ...] = ()
    start: tuple[StartAction, ...] = ()
    waiting: Mapping[str, Waiting] = field(default_factory=dict)
    pod_failed: bool = False        # an init container failed under restartPolicy Never
    retry_after: float | None = None  # seconds until the earliest back-off ends
    remove_sandboxes: tuple[str, ...] = ()  # not-ready sandboxes without containers: stop+remove
    failed: bool = False  # the pod is Failed for good: everything stopped, nothing started
    deadline_exceeded: bool = False  # ... because activeDeadlineSeconds passed (this sync saw)
    kill_grace: int | None = None  # ``kill_pod``'s grace (None: terminationGracePeriodSeconds)

    @property
    def noop(self) -> bool:
        return not (self.kill_pod or self.create_sandbox or self.kill or self.start
                    or self.remove_sandboxes)


Hasher = Callable[[Container], str]
SandboxWait = Callable[[str], float]  # sandbox id -> seconds its stop still backs off (0: due)


def _no_wait(sandbox_id: str) -> float:
    return 0.0


def _sandbox_changed(rt: PodRuntime) -> tuple[bool, int, str]:
    """(create a new sandbox?, its attempt, the current sandbox id). The new attempt is the
    largest listed one + 1: the newest sandbox by creation time may not carry it (containerd
    lists a sandbox whose network setup failed with no creation time)."""
    if not rt.sandboxes:
        return True, 0, ""
    latest = rt.sandboxes[0]
    ready = sum(1 for s in rt.sandboxes if s.ready)
    if ready > 1 or not latest.ready:
        return True, max(s.attempt for s in rt.sandboxes) + 1, latest.id
    return False, latest.attempt, latest.id


def _dead_sandboxes(rt: PodRuntime, wait: SandboxWait) -> tuple[tuple[str, ...], float | None]:
    """(not-ready sandboxes without containers whose stop is due, seconds until the next one
    backing off is due)."""
    used = {c.sandbox_id for c in rt.containers}
    due: list[str] = []
    retry: float | None = None
    for s in rt.sandboxes:
        if s.ready or s.id in used:
            continue
        left = wait(s.id)
        if left > 0:
            retry = left if retry is None else min(retry, left)
        else:
            due.append(s.id)
    return tuple(due), retry


def _with_dead(actions: PodActions, rt: PodRuntime, wait: SandboxWait) -> PodActions:
    dead, retry = _dead_sandboxes(rt, wait)
    if not dead and retry is None:
        return actions
    if retry is not None and actions.retry_after is not None:
        retry = min(retry, actions.retry_after)
    return replace(actions, remove_sandboxes=dead,
                   retry_after=retry if retry is not None else actions.retry_after)


def _restarts_on_failure(pod: Pod) -> bool:
    return pod.spec.restart_policy is not RestartPolicy.NEVER


def _should_restart(pod: Pod, status: ContainerInfo | None) -> bool:
    """The kubelet's shouldContainerBeRestarted, for a container that is not running."""
    if (status is None or status.state in (ContainerState.UNKNOWN, ContainerState.CREATED)
            or lost_attempt(status)):
        return True
    if status.state is ContainerState.RUNNING:
        return False
    policy = pod.spec.restart_policy
    if policy is RestartPolicy.NEVER:
        return False
    return not (policy is RestartPolicy.ON_FAILURE and status.exit_code == 0)


def _start(container: Container, init: bool, status: ContainerInfo | None,
           ephemeral: bool = False) -> StartAction:
    sidecar = init and container.sidecar
    if status is None:
        return StartAction(container.name, init, 0, ephemeral=ephemeral, sidecar=sidecar)
    return StartAction(container.name, init, status.restart_count + 1, status.finished_at,
                       ephemeral=ephemeral, sidecar=sidecar)


class _Builder:
    """Collects actions; applies the crash back-off to every start."""

    def __init__(self, pod: Pod, rt: PodRuntime, now: float, backoff: BackoffView,
                 hasher: Hasher) -> None:
        self.pod, self.rt, self.now, self.backoff = pod, rt, now, backoff
        self.hasher = hasher
        self.sandbox_id = ""  # the current sandbox, when no new one is made
        self.kill: list[KillAction] = []
        self.start: list[StartAction] = []
        self.waiting: dict[str, Waiting] = {}
        self.retry_after: float | None = None

    def want_start(self, container: Container, init: bool, kill_stale: bool = True,
                   ephemeral: bool = False) -> None:
        status = self.rt.latest(container.name)
        if (status is not None and status.state is ContainerState.CREATED and self.sandbox_id
                and status.sandbox_id == self.sandbox_id
                and same_spec(status.hash, container, self.hasher)):
            self.start.append(replace(_start(container, init, None, ephemeral),
                                      restart_count=status.restart_count,
                                      container_id=status.id))
            return
        if status is not None and (lost_attempt(status) or _died_under(status, self.rt)):
            # the same attempt, in its place
            if kill_stale and status.state is ContainerState.UNKNOWN:
                self.kill.append(KillAction(status.id, container.name, "stale container"))
            self.start.append(replace(_start(container, init, None, ephemeral),
                                      restart_count=status.restart_count,
                                      replaces=status.id))
            return
        if (kill_stale and status is not None
                and status.state in (ContainerState.UNKNOWN, ContainerState.CREATED)):
            self.kill.append(KillAction(status.id, container.name, "stale container"))
        action = _start(container, init, status, ephemeral)
        if status is not None and status.finished_at > 0:
            left = self.backoff.remaining((self.pod.uid, container.name), status.finished_at,
                                          self.now)
            if left > 0:
                self.waiting[container.name] = Waiting(
                    CRASH_LOOP_BACK_OFF,
                    f"back-off {left:.0f}s restarting failed container={container.name} "
                    f"pod={self.pod.full_name}({self.pod.uid})")
                self.retry_after = left if self.retry_after is None else min(
                    self.retry_after, left)
                return
        self.start.append(action)

    def actions(self, sandbox_id: str, attempt: int, kill_pod: bool = False,
                pod_failed: bool = False) -> PodActions:
        """The collected kills, starts, waiting reasons and back-off."""
        return PodActions(kill_pod=kill_pod, sandbox_id=sandbox_id, attempt=attempt,
                          kill=tuple(self.kill), start=tuple(self.start),
                          waiting=dict(self.waiting), pod_failed=pod_failed,
                          retry_after=self.retry_after)


def _kill_unknown(b: _Builder, pod: Pod, rt: PodRuntime) -> None:
    names = {c.name for c in pod.all_containers()}
    names |= {e.name for e in pod.spec.ephemeral_containers}
    for c in rt.containers:
        if c.name not in names and c.state in (ContainerState.RUNNING, ContainerState.CREATED):
            b.kill.append(KillAction(c.id, c.name, "not in the pod spec"))


def _new_sandbox_actions(pod: Pod, rt: PodRuntime, b: _Builder, attempt: int,
                         sandbox_id: str) -> PodActions:
    base = PodActions(kill_pod=True, create_sandbox=True, sandbox_id=sandbox_id, attempt=attempt)
    if not _restarts_on_failure(pod) and attempt != 0 and rt.containers:
        return PodActions(kill_pod=True, sandbox_id=sandbox_id, attempt=attempt)
    regular = [c for c in pod.spec.containers
               if not (pod.spec.restart_policy is RestartPolicy.ON_FAILURE
                       and _succeeded(rt.latest(c.name)))]
    if not regular and not (pod.spec.sidecars and not _any_regular_created(pod, rt)):
        return PodActions(kill_pod=True, sandbox_id=sandbox_id, attempt=attempt)
    if pod.spec.init_containers:
        b.want_start(pod.spec.init_containers[0], init=True, kill_stale=False)
        b.waiting.update({c.name: Waiting(POD_INITIALIZING) for c in pod.spec.containers})
    else:
        for c in regular:
            b.want_start(c, init=False, kill_stale=False)
    return PodActions(kill_pod=base.kill_pod, create_sandbox=True, sandbox_id=sandbox_id,
                      attempt=attempt, start=tuple(b.start), waiting=dict(b.waiting),
                      retry_after=b.retry_after)


def _any_regular_created(pod: Pod, rt: PodRuntime) -> bool:
    """``hasAnyRegularContainerCreated``: a regular container was created, so the pod was
    initialized before (its init containers are not run again)."""
    return any((s := rt.latest(c.name)) is not None and s.state in (
        ContainerState.CREATED, ContainerState.RUNNING, ContainerState.EXITED)
        for c in pod.spec.containers)


def _succeeded(status: ContainerInfo | None) -> bool:
    return (status is not None and status.state is ContainerState.EXITED
            and status.exit_code == 0)


def compute_pod_actions(
    pod: Pod, rt: PodRuntime, now: float, backoff: BackoffView,
    liveness_failed: Collection[str] = (), hasher: Hasher = container_hash,
    sandbox_wait: SandboxWait = _no_wait, started: Collection[str] = (),
    failed: bool = False, resize_restart: Collection[str] = (),
) -> PodActions:
    """What to do for ``pod`` given its runtime state ``rt`` at monotonic time ``now``.

    ``liveness_failed``: IDs of running containers whose liveness or startup probe failed
    (a mapping ID -> "liveness"/"startup" tells which: the kill's reason, and so its grace).
    ``sandbox_wait``: seconds a sandbox's stop still backs off after it failed (0: due).
    ``started``: IDs of running containers whose startup probe succeeded (a sidecar with a
    startup probe lets the next init container start only then).
    ``failed``: the pod is Failed for good (past ``activeDeadlineSeconds``, or failed through
    ``SyncLoop.fail_pod``): every container is stopped (sidecars last) and nothing is started
    again.
    ``resize_restart``: IDs of running regular containers and sidecars an in-place resize
    restarts (their ``resizePolicy`` is RestartContainer for a resource that changed:
    ``resize.py``): killed and started again at once with the pod's (allocated) resources, a
    restart counted.
    """
    if failed:
        live = bool(rt.running()) or any(s.ready for s in rt.sandboxes)
        return _with_dead(PodActions(kill_pod=live, pod_failed=True, failed=True,
                                     sandbox_id=rt.sandboxes[0].id if rt.sandboxes else ""),
                          rt, sandbox_wait)
    return _with_dead(_compute(pod, rt, now, backoff, liveness_failed, hasher, started,
                               resize_restart), rt, sandbox_wait)


def _regular_done(pod: Pod, rt: PodRuntime) -> bool:
    """Every regular container ran and exited for good (restartPolicy Never or OnFailure
    with exit 0): the pod is terminal."""
    statuses = [rt.latest(c.name) for c in pod.spec.containers]
    return all(s is not None and s.state is ContainerState.EXITED and not _should_restart(pod, s)
               for s in statuses)


def _failed_map(liveness_failed: Collection[str]) -> Mapping[str, str]:
    if isinstance(liveness_failed, Mapping):
        return liveness_failed
    return dict.fromkeys(liveness_failed, "liveness")


def _compute(pod: Pod, rt: PodRuntime, now: float, backoff: BackoffView,
             liveness_failed: Collection[str], hasher: Hasher,
             started: Collection[str], resize_restart: Collection[str] = ()) -> PodActions:
    b = _Builder(pod, rt, now, backoff, hasher)
    create, attempt, sandbox_id = _sandbox_changed(rt)
    if create:
        return _new_sandbox_actions(pod, rt, b, attempt, sandbox_id)
    b.sandbox_id = sandbox_id
    _kill_unknown(b, pod, rt)
    for e in pod.spec.ephemeral_containers:  # SyncPod step 5: never restarted
        if rt.latest(e.name) is None:
            b.want_start(e.container, init=False, kill_stale=False, ephemeral=True)
    failed = _failed_map(liveness_failed)
    if pod.spec.sidecars and _regular_done(pod, rt):
        # the pod is over (the kubelet's worker stops syncing a terminal pod): its sidecars
        # are stopped and not started again
        b.start = [a for a in b.start if not a.ephemeral]
        return b.actions(kill_pod=True, sandbox_id=sandbox_id, attempt=attempt)
    if pod.spec.sidecars:
        plan = sidecar_actions(pod, rt, failed, started, hasher, resize_restart)
        b.kill.extend(KillAction(cid, name, why) for cid, (name, why) in plan.kills.items())
        if not plan.kill_pod:
            for c in plan.starts:
                b.want_start(c, init=True, kill_stale=False)
        if plan.kill_pod or not plan.initialized:
            b.waiting.update({c.name: Waiting(POD_INITIALIZING) for c in pod.spec.containers})
            return b.actions(kill_pod=plan.kill_pod, sandbox_id=sandbox_id, attempt=attempt,
                             pod_failed=plan.kill_pod)
    else:
        last_failed, next_container, done = next_init(pod, rt)
        if not done:
            b.waiting.update({c.name: Waiting(POD_INITIALIZING) for c in pod.spec.containers})
            failed_never = last_failed is not None and not _restarts_on_failure(pod)
            if next_container is not None and not failed_never:
                b.want_start(next_container, init=True)
            return b.actions(kill_pod=failed_never, sandbox_id=sandbox_id, attempt=attempt,
                             pod_failed=failed_never)
    keep = wanted = 0
    for c in pod.spec.containers:
        status = rt.latest(c.name)
        if status is None or status.state is not ContainerState.RUNNING:
            if _should_restart(pod, status):
                wanted += 1
                b.want_start(c, init=False)
            continue
        if not same_spec(status.hash, c, hasher):
            reason, restart = SPEC_CHANGED, True
        elif status.id in resize_restart:
            reason, restart = RESIZE_RESTART, True
        elif status.id in failed:
            reason = STARTUP_FAILED if failed[status.id] == "startup" else LIVENESS_FAILED
            restart = _restarts_on_failure(pod)
        else:
            keep += 1
            continue
        b.kill.append(KillAction(status.id, c.name, reason))
        if restart:
            wanted += 1
            b.want_start(c, init=False)
    if keep == 0 and wanted == 0:
        # every regular container is done: the pod ends, sidecars and ephemeral containers
        # are not started again (the kubelet drops InitContainersToStart)
        b.start = [a for a in b.start if not (a.sidecar or a.ephemeral)]
        for a in pod.spec.sidecars:
            b.waiting.pop(a.name, None)
        return b.actions(kill_pod=True, sandbox_id=sandbox_id, attempt=attempt)
    return b.actions(sandbox_id=sandbox_id, attempt=attempt)
