"""Which init containers a sync starts or kills: the kubelet's two paths, pure.

- ``next_init`` (``findNextInitContainerToRun``): a pod without sidecars runs its init
  containers one at a time, in order; the next starts only after the previous exited 0.
- ``sidecar_actions`` (``computeInitContainerActions``, the SidecarContainers path the kubelet
  takes for a pod with a restartable init container, ``restartPolicy: Always``): the init
  containers are walked from the last one back; a sidecar counts as done (the next init
  container may start) once it runs and its startup probe, if any, succeeded; a sidecar that
  exited, or whose liveness or startup probe failed, or whose spec changed, is started again
  whatever the pod's restartPolicy (with the crash back-off); after initialization (a regular
  container was created) only sidecars are looked at. The starts come back in spec order.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from podvisor.services.pod import Container, Pod, RestartPolicy
from podvisor.services.syncloop.attempts import lost_attempt
from podvisor.services.syncloop.runtime_state import ContainerInfo, ContainerState, PodRuntime
from podvisor.services.syncloop.spec import same_spec

LIVENESS_FAILED = "liveness probe failed"
STARTUP_FAILED = "startup probe failed"
SPEC_CHANGED = "container spec changed"
RESIZE_RESTART = "resize requires restart"  # the kubelet: "Container X resize requires restart"
UNKNOWN_STATE = "unknown state, killed before restart"


Hasher = Callable[[Container], str]


def init_failed(status: ContainerInfo) -> bool:
    return (status.state is ContainerState.UNKNOWN or (
        status.state is ContainerState.EXITED and status.exit_code != 0)) \
        and not lost_attempt(status)


def next_init(pod: Pod, rt: PodRuntime) -> tuple[ContainerInfo | None, Container | None, bool]:
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
        if status is not None and init_failed(status):
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


@dataclass
class InitPlan:
    """What ``sidecar_actions`` decided: init containers to start (spec order), running ones
    to kill first (container ID -> (name, reason)), whether the pod is initialized, and
    whether a failed init container under restartPolicy Never ends the pod."""

    starts: list[Container] = field(default_factory=list)
    kills: dict[str, tuple[str, str]] = field(default_factory=dict)
    initialized: bool = False
    kill_pod: bool = False


def _probe_verdict(c: Container, status: ContainerInfo, failed: Mapping[str, str],
                   started: Collection[str]) -> str:
    """A running sidecar's probes as the kubelet reads them: "wait" (its startup probe has
    not succeeded yet), "startup"/"liveness" (that probe failed: restart it), "ok"."""
    if c.startup_probe is not None:
        if failed.get(status.id) == "startup":
            return "startup"
        if status.id not in started:
            return "wait"
    if c.liveness_probe is not None and failed.get(status.id) == "liveness":
        return "liveness"
    return "ok"


def sidecar_actions(pod: Pod, rt: PodRuntime, failed: Mapping[str, str],
                    started: Collection[str], hasher: Hasher,
                    resize_restart: Collection[str] = ()) -> InitPlan:
    """The kubelet's ``computeInitContainerActions``. ``failed``: container ID -> the probe
    that failed ("liveness"/"startup"); ``started``: IDs whose startup probe succeeded;
    ``resize_restart``: IDs of sidecars an in-place resize restarts."""
    inits = pod.spec.init_containers
    plan = InitPlan()
    if not inits:
        plan.initialized = True
        return plan
    plan.initialized = any(
        (s := rt.latest(c.name)) is not None
        and s.state in (ContainerState.CREATED, ContainerState.RUNNING)
        for c in pod.spec.containers)
    previously = plan.initialized
    restart = pod.spec.restart_policy is not RestartPolicy.NEVER
    starts: list[int] = []
    last = len(inits) - 1
    for i in range(last, -1, -1):
        c = inits[i]
        status = rt.latest(c.name)
        if status is None:
            if previously and c.sidecar:
                starts.append(i)  # its status is gone: restart it
            continue
        if previously and not c.sidecar:
            continue  # after initialization only sidecars are kept running
        if status.state is ContainerState.CREATED or lost_attempt(status):
            starts.append(i)  # never started, or its attempt was lost: start it (again)
        elif status.state is ContainerState.RUNNING:
            if c.sidecar:
                _running_sidecar(plan, starts, i, last, previously, c, status, failed, started,
                                 hasher, status.id in resize_restart)
        elif status.state is ContainerState.EXITED:
            if c.sidecar:
                starts.append(i)
            elif init_failed(status):
                if not restart:
                    return InitPlan(kills=plan.kills, kill_pod=True)
                starts.append(i)
            elif i == last:
                plan.initialized = True
            else:
                starts.append(i + 1)
        else:  # unknown: kill it before it runs again
            if not c.sidecar and not restart:
                return InitPlan(kills=plan.kills, kill_pod=True)
            plan.kills[status.id] = (c.name, UNKNOWN_STATE)
            starts.append(i)
        previously = True
    if not previously:
        starts.append(0)
    plan.starts = [inits[i] for i in sorted(set(starts))]
    return plan


def _running_sidecar(plan: InitPlan, starts: list[int], i: int, last: int, previously: bool,
                     c: Container, status: ContainerInfo, failed: Mapping[str, str],
                     started: Collection[str], hasher: Hasher, resize: bool = False) -> None:
    verdict = _probe_verdict(c, status, failed, started)
    if verdict == "wait":
        return
    if verdict == "startup":
        plan.kills[status.id] = (c.name, STARTUP_FAILED)
        starts.append(i)
        return
    if i == last:
        plan.initialized = True
    elif not previously:
        starts.append(i + 1)  # this sidecar is up for the first time: the next one may start
    if not same_spec(status.hash, c, hasher):
        plan.kills[status.id] = (c.name, SPEC_CHANGED)
        starts.append(i)
    elif verdict == "liveness":
        plan.kills[status.id] = (c.name, LIVENESS_FAILED)
        starts.append(i)
    elif resize:
        plan.kills[status.id] = (c.name, RESIZE_RESTART)
        starts.append(i)
