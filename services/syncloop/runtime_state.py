"""A pod's runtime state as the sync loop sees it, read fresh from CRI before every sync.

``PodRuntime`` is plain data (frozen dataclasses) so ``compute_pod_actions`` stays pure. CRI
reports wall-clock nanoseconds; ``read_pod_runtime`` converts them once, at this boundary, to
the caller's monotonic clock (``mono = now_mono - (now_wall - wall)``), so nothing downstream
mixes clocks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError, RuntimeClient
from podvisor.services.syncloop import labels as L


class ContainerState(StrEnum):
    CREATED = "created"
    RUNNING = "running"
    EXITED = "exited"
    UNKNOWN = "unknown"


_STATES = {
    pb.CONTAINER_CREATED: ContainerState.CREATED,
    pb.CONTAINER_RUNNING: ContainerState.RUNNING,
    pb.CONTAINER_EXITED: ContainerState.EXITED,
}


@dataclass(frozen=True)
class SandboxInfo:
    id: str
    ready: bool
    attempt: int
    created_at: int  # ns, only for ordering


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    sandbox_id: str
    state: ContainerState
    hash: str
    restart_count: int
    created_at: int           # ns, only for ordering (newest first)
    exit_code: int = 0
    started_at: float = 0.0   # monotonic seconds (0 = unknown)
    finished_at: float = 0.0  # monotonic seconds (0 = unknown)
    reason: str = ""
    message: str = ""         # the runtime's word on the exit (e.g. why a start failed)
    never_started: bool = False  # the runtime says it exited without ever starting
    grace: int = -1           # terminationGracePeriodSeconds recorded at creation (-1 unknown)
    pre_stop: str = ""        # the preStop handler recorded at creation (JSON, "" none)
    ports: str = ""           # the container's ports recorded at creation (JSON, "" none)
    pod_ref: str = ""         # "<name>_<namespace>(<uid>)" from its labels (a hook's message)


@dataclass(frozen=True)
class PodRuntime:
    """Sandboxes and containers carrying the pod's UID label (newest first)."""

    sandboxes: tuple[SandboxInfo, ...] = ()
    containers: tuple[ContainerInfo, ...] = ()

    def latest(self, name: str) -> ContainerInfo | None:
        """The newest container with this name."""
        for c in self.containers:
            if c.name == name:
                return c
        return None

    def running(self) -> tuple[ContainerInfo, ...]:
        return tuple(c for c in self.containers if c.state is ContainerState.RUNNING)

    @property
    def empty(self) -> bool:
        return not self.sandboxes and not self.containers


def _to_mono(ns: int, now_mono: float, now_wall: float) -> float:
    if ns <= 0:
        return 0.0
    return now_mono - (now_wall - ns / 1e9)


def _container(c: pb.Container, status: pb.ContainerStatus | None, now_mono: float,
               now_wall: float) -> ContainerInfo:
    ann = c.annotations
    info = ContainerInfo(
        id=c.id, name=c.labels.get(L.CONTAINER_NAME, c.metadata.name),
        sandbox_id=c.pod_sandbox_id, state=_STATES.get(c.state, ContainerState.UNKNOWN),
        hash=ann.get(L.CONTAINER_HASH, ""), restart_count=L.parse_int(ann.get(L.RESTART_COUNT)),
        created_at=c.created_at, grace=L.parse_int(ann.get(L.GRACE_PERIOD), -1),
        pre_stop=ann.get(L.PRE_STOP, ""), ports=ann.get(L.CONTAINER_PORTS, ""),
        pod_ref=_pod_ref(c.labels),
    )
    if status is None:
        return info
    return replace(
        info,
        state=_STATES.get(status.state, ContainerState.UNKNOWN), exit_code=status.exit_code,
        started_at=_to_mono(status.started_at, now_mono, now_wall),
        finished_at=_to_mono(status.finished_at, now_mono, now_wall), reason=status.reason,
        message=status.message, never_started=_never_started(status),
    )


def _pod_ref(labels: Mapping[str, str]) -> str:
    """The kubelet's ``format.Pod`` of the pod a container's labels name."""
    return (f"{labels.get(L.POD_NAME, '')}_{labels.get(L.POD_NAMESPACE, '')}"
            f"({labels.get(L.POD_UID, '')})")


def _never_started(status: pb.ContainerStatus) -> bool:
    return status.state == pb.CONTAINER_EXITED and status.started_at <= 0


def container_from_status(s: pb.ContainerStatus, sandbox_id: str, now_mono: float,
                          now_wall: float) -> ContainerInfo:
    """A ``ContainerInfo`` from a full ContainerStatus (as an event carries it): the status has
    the labels and annotations a listed ``pb.Container`` has, but not the sandbox ID."""
    ann = s.annotations
    return ContainerInfo(
        id=s.id, name=s.labels.get(L.CONTAINER_NAME, s.metadata.name), sandbox_id=sandbox_id,
        state=_STATES.get(s.state, ContainerState.UNKNOWN), hash=ann.get(L.CONTAINER_HASH, ""),
        restart_count=L.parse_int(ann.get(L.RESTART_COUNT)), created_at=s.created_at,
        exit_code=s.exit_code, started_at=_to_mono(s.started_at, now_mono, now_wall),
        finished_at=_to_mono(s.finished_at, now_mono, now_wall), reason=s.reason,
        message=s.message, never_started=_never_started(s),
        grace=L.parse_int(ann.get(L.GRACE_PERIOD), -1),
        pre_stop=ann.get(L.PRE_STOP, ""), ports=ann.get(L.CONTAINER_PORTS, ""),
        pod_ref=_pod_ref(s.labels),
    )


def newest_first(containers: Sequence[ContainerInfo]) -> tuple[ContainerInfo, ...]:
    """The order of ``PodRuntime.containers``: by creation time, then restart count."""
    return tuple(sorted(containers, key=lambda c: (c.created_at, c.restart_count),
                        reverse=True))


NeedStatus = Callable[[str, int], bool]  # (container name, restart count) of a running one


def _always(name: str, restart_count: int) -> bool:
    return True


def read_pod_runtime(cri: RuntimeClient, uid: str, now_mono: Callable[[], float],
                     now_wall: Callable[[], float],
                     running_status: NeedStatus = _always) -> PodRuntime:
    """List the pod's sandboxes and containers by its UID label, with the status of each
    newest-per-name container (exit code, finish time; for a running one only when
    ``running_status`` asks: its start time)."""
    selector = {L.POD_UID: uid}
    sandboxes = cri.list_pod_sandbox(pb.PodSandboxFilter(label_selector=selector))
    containers = cri.list_containers(pb.ContainerFilter(label_selector=selector))
    return pod_runtime(cri, sandboxes, containers, now_mono, now_wall, running_status)


def pod_runtime(cri: RuntimeClient, sandboxes: Sequence[pb.PodSandbox],
                containers: Sequence[pb.Container], now_mono: Callable[[], float],
                now_wall: Callable[[], float], running_status: NeedStatus = _always
                ) -> PodRuntime:
    """One pod's ``PodRuntime`` from its listed sandboxes and containers (ContainerStatus of
    the newest per name, as ``read_pod_runtime`` says)."""
    ordered = sorted(containers, key=lambda c: (
        c.created_at, L.parse_int(c.annotations.get(L.RESTART_COUNT))), reverse=True)
    mono, wall = now_mono(), now_wall()
    seen: set[str] = set()
    out: list[ContainerInfo] = []
    for c in ordered:
        name = c.labels.get(L.CONTAINER_NAME, c.metadata.name)
        status = None
        if name not in seen:
            seen.add(name)
            running = c.state == pb.CONTAINER_RUNNING
            if not running or running_status(
                    name, L.parse_int(c.annotations.get(L.RESTART_COUNT))):
                try:
                    status = cri.container_status(c.id)
                except CriError as err:
                    if not err.not_found:
                        raise
                    continue
        out.append(_container(c, status, mono, wall))
    # newest first; on equal times (containerd lists sandboxes whose setup failed with none)
    # the higher attempt first
    boxes = sorted(
        (SandboxInfo(s.id, s.state == pb.SANDBOX_READY, s.metadata.attempt, s.created_at)
         for s in sandboxes),
        key=lambda s: (s.created_at, s.attempt), reverse=True,
    )
    return PodRuntime(tuple(boxes), tuple(out))
