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
- Init containers run one at a time in order; the next starts only after the previous exited 0.
  A failed init container restarts unless restartPolicy is Never, which fails the pod.
- Then every regular container; a stopped one restarts by policy (Always: yes; OnFailure: if the
  exit code != 0; Never: no).
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
from podvisor.services.syncloop.backoff import BackoffKey
from podvisor.services.syncloop.runtime_state import ContainerInfo, ContainerState, PodRuntime
from podvisor.services.syncloop.spec import container_hash

CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
POD_INITIALIZING = "PodInitializing"


# StartErrors that are no failure of the container: each entry's parts all appear in the
# message (containerd 1.6's wording). Any other StartError (runc refused the spec: no such
# executable, a bad mount, ...) is the container's, and counts.
START_ERROR = "StartError"
_NOT_THE_CONTAINERS: tuple[tuple[str, ...], ...] = (
    # the CRI call's context ended: its client (the sync loop) went away in the middle of it
    ("context canceled",),
    # the shim's start command, run under that context, was killed with it
    ("failed to start shim", "signal: killed"),
    # containerd could not wire the container's stdio to its log, before runc was asked for
    # anything (seen after containerd's own crash: a shim from before it never got its fifos
    # opened, and the start ended after containerd's 30 s deadline)
    ("failed to start io pipe copy",),
)


def lost_attempt(c: ContainerInfo) -> bool:
    """``c`` never ran, and not by its own doing: the runtime or the sync loop lost it half-way
    (died, or failed itself, in the middle of the create or the start). It can never be
    started, and the attempt it stands for is not used up. The shapes (containerd 1.6):

    - exited with a StartError that is not the container's (``_NOT_THE_CONTAINERS``; a start
      cut off by containerd's own crash leaves the container created, and its resumption is
      replaced at once if containerd refuses it: syncpod ``start_created``);
    - exited without ever starting, and not because a start failed: the runtime ended a task
      it had made for a start that its own crash cut off (containerd: the restarted one finds
      that task's shim gone and exits the container "Error", code 1, no message; the embedded
      runtime: "Unknown", 255, its monitor gone);
    - unknown, with no creation time: the runtime lost the record of its create (containerd
      writes it at the end of CreateContainer; a crash before that leaves the container
      listed in state unknown, created at 0).
    """
    if c.state is ContainerState.UNKNOWN:
        return c.created_at <= 0 and c.started_at <= 0
    if not c.never_started:
        return False
    return c.reason != START_ERROR or any(all(part in c.message for part in parts)
                                          for parts in _NOT_THE_CONTAINERS)


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


LIVENESS_FAILED = "liveness probe failed"
STARTUP_FAILED = "startup probe failed"


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


def _init_failed(status: ContainerInfo) -> bool:
    return (status.state is ContainerState.UNKNOWN or (
        status.state is ContainerState.EXITED and status.exit_code != 0)) \
        and not lost_attempt(status)


def _next_init(pod: Pod, rt: PodRuntime) -> tuple[ContainerInfo | None, Container | None, bool]:
    """(last failed init status, next init container to run, all init containers done)."""
    inits = pod.spec.init_containers
    if not inits:
        return None, None, True
    for c in pod.spec.containers:
        status = rt.latest(c.name)
        if status is not None and status.state is ContainerState.RUNNING:
            return None, None, True
    for c in reversed(inits):
        status = rt.latest(c.name)
        if status is not None and _init_failed(status):
            return status, c, False
    for i in range(len(inits) - 1, -1, -1):
        status = rt.latest(inits[i].name)
        if status is None:
            continue
        if status.state is ContainerState.RUNNING:
            return None, None, False
        if status.state is ContainerState.CREATED or lost_attempt(status):
            return None, inits[i], False  # created, never started: start it (or again) now
        if status.state is ContainerState.EXITED:
            if i == len(inits) - 1:
                return None, None, True
            return None, inits[i + 1], False
    return None, inits[0], False


def _start(name: str, init: bool, status: ContainerInfo | None) -> StartAction:
    if status is None:
        return StartAction(name, init, 0)
    return StartAction(name, init, status.restart_count + 1, status.finished_at)


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

    def want_start(self, container: Container, init: bool, kill_stale: bool = True) -> None:
        status = self.rt.latest(container.name)
        if (status is not None and status.state is ContainerState.CREATED and self.sandbox_id
                and status.sandbox_id == self.sandbox_id
                and status.hash == self.hasher(container)):
            self.start.append(StartAction(container.name, init, status.restart_count,
                                          container_id=status.id))
            return
        if status is not None and (lost_attempt(status) or _died_under(status, self.rt)):
            # the same attempt, in its place
            if kill_stale and status.state is ContainerState.UNKNOWN:
                self.kill.append(KillAction(status.id, container.name, "stale container"))
            self.start.append(StartAction(container.name, init, status.restart_count,
                                          replaces=status.id))
            return
        if (kill_stale and status is not None
                and status.state in (ContainerState.UNKNOWN, ContainerState.CREATED)):
            self.kill.append(KillAction(status.id, container.name, "stale container"))
        action = _start(container.name, init, status)
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


def _kill_unknown(b: _Builder, pod: Pod, rt: PodRuntime) -> None:
    names = {c.name for c in pod.all_containers()}
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
    if not regular:
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


def _succeeded(status: ContainerInfo | None) -> bool:
    return (status is not None and status.state is ContainerState.EXITED
            and status.exit_code == 0)


def compute_pod_actions(
    pod: Pod, rt: PodRuntime, now: float, backoff: BackoffView,
    liveness_failed: Collection[str] = (), hasher: Hasher = container_hash,
    sandbox_wait: SandboxWait = _no_wait,
) -> PodActions:
    """What to do for ``pod`` given its runtime state ``rt`` at monotonic time ``now``.

    ``liveness_failed``: IDs of running containers whose liveness or startup probe failed
    (a mapping ID -> "liveness"/"startup" tells which: the kill's reason, and so its grace).
    ``sandbox_wait``: seconds a sandbox's stop still backs off after it failed (0: due).
    """
    return _with_dead(_compute(pod, rt, now, backoff, liveness_failed, hasher), rt,
                      sandbox_wait)


def _compute(pod: Pod, rt: PodRuntime, now: float, backoff: BackoffView,
             liveness_failed: Collection[str], hasher: Hasher) -> PodActions:
    b = _Builder(pod, rt, now, backoff, hasher)
    create, attempt, sandbox_id = _sandbox_changed(rt)
    if create:
        return _new_sandbox_actions(pod, rt, b, attempt, sandbox_id)
    b.sandbox_id = sandbox_id
    _kill_unknown(b, pod, rt)
    last_failed, next_init, done = _next_init(pod, rt)
    if not done:
        b.waiting.update({c.name: Waiting(POD_INITIALIZING) for c in pod.spec.containers})
        failed_never = last_failed is not None and not _restarts_on_failure(pod)
        if next_init is not None and not failed_never:
            b.want_start(next_init, init=True)
        return PodActions(kill_pod=failed_never, sandbox_id=sandbox_id, attempt=attempt,
                          kill=tuple(b.kill), start=tuple(b.start), waiting=dict(b.waiting),
                          pod_failed=failed_never, retry_after=b.retry_after)
    keep = 0
    for c in pod.spec.containers:
        status = rt.latest(c.name)
        if status is None or status.state is not ContainerState.RUNNING:
            if _should_restart(pod, status):
                b.want_start(c, init=False)
            continue
        if status.hash != hasher(c):
            reason, restart = "container spec changed", True
        elif status.id in liveness_failed:
            probe = liveness_failed.get(status.id) if isinstance(liveness_failed, Mapping) \
                else "liveness"
            reason = STARTUP_FAILED if probe == "startup" else LIVENESS_FAILED
            restart = _restarts_on_failure(pod)
        else:
            keep += 1
            continue
        b.kill.append(KillAction(status.id, c.name, reason))
        if restart:
            b.want_start(c, init=False)
    kill_pod = keep == 0 and not b.start and not b.waiting
    return PodActions(kill_pod=kill_pod, sandbox_id=sandbox_id, attempt=attempt,
                      kill=tuple(b.kill), start=tuple(b.start), waiting=dict(b.waiting),
                      retry_after=b.retry_after)
