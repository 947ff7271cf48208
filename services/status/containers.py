"""Container statuses from PLEG records (kubelet ``convertToAPIContainerStatuses``). Pure.

For each container of the spec, the runtime containers of that name are taken newest first: the
newest gives ``state``, the one before it ``lastState``. A waiting reason from the sync loop
(``CrashLoopBackOff``, ``CreateContainerError``, ...) replaces a non-running state, and the
container it replaces becomes ``lastState``.
"""

from __future__ import annotations

from collections.abc import Sequence

from podvisor.common.timefmt import rfc3339_ns
from podvisor.ipc.maps import ContainerWaiting, PlegContainer
from podvisor.ipc.podstatus import ContainerState, ContainerStatus, Running, Terminated, Waiting
from podvisor.services.pod import Container

RUNNING = "CONTAINER_RUNNING"
EXITED = "CONTAINER_EXITED"


def container_id(runtime: str, cid: str) -> str:
    return f"{runtime}://{cid}"


def terminated_state(c: PlegContainer, runtime: str) -> Terminated:
    code = c.exit_code
    return Terminated(exit_code=code, reason=c.reason or ("Completed" if code == 0 else "Error"),
                      started_at=rfc3339_ns(c.started_at), finished_at=rfc3339_ns(c.finished_at),
                      container_id=container_id(runtime, c.id), message=c.message)


def runtime_state(c: PlegContainer, runtime: str) -> ContainerState:
    state = c.state
    if state == RUNNING:
        return ContainerState(running=Running(rfc3339_ns(c.started_at)))
    if state == EXITED:
        return ContainerState(terminated=terminated_state(c, runtime))
    return ContainerState(waiting=Waiting("ContainerCreating"))


def container_status(
    spec: Container,
    runtime_containers: Sequence[PlegContainer],
    waiting: ContainerWaiting | None,
    default_reason: str,
    runtime: str,
    ready_override: bool | None = None,
    started_override: bool | None = None,
) -> ContainerStatus:
    """One ``ContainerStatus``. ``runtime_containers`` are this name's records in any order;
    ``ready_override`` / ``started_override`` are the prober's readiness / startup verdicts
    when it reports them."""
    history = sorted(runtime_containers, key=lambda c: (c.created_at, c.id), reverse=True)
    last = ContainerState()
    cid = image_id = ""
    restarts = 0
    if history:
        cur = history[0]
        state = runtime_state(cur, runtime)
        cid, image_id, restarts = container_id(runtime, cur.id), cur.image_ref, cur.restart_count
        if len(history) > 1 and history[1].state == EXITED:
            last = ContainerState(terminated=terminated_state(history[1], runtime))
    else:
        state = ContainerState(waiting=Waiting(default_reason))
    if waiting and state.running is None:
        if state.terminated is not None:
            last = state
        state = ContainerState(waiting=Waiting(waiting.reason, waiting.message))
    running = state.running is not None
    if started_override is not None:
        started = running and started_override
    else:
        started = running and spec.startup_probe is None
    if ready_override is not None:
        ready = running and ready_override
    else:
        ready = running and spec.readiness_probe is None
    return ContainerStatus(name=spec.name, image=spec.image, image_id=image_id,
                           restart_count=restarts, ready=ready, started=started,
                           container_id=cid, state=state, last_state=last)


def by_name(records: Sequence[PlegContainer]) -> dict[str, list[PlegContainer]]:
    out: dict[str, list[PlegContainer]] = {}
    for c in records:
        out.setdefault(c.name, []).append(c)
    return out
