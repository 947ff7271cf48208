"""The embedded runtime's records and states: plain data, no I/O."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from cri_api.v1 import api_pb2 as pb


class ContainerState(enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    EXITED = "exited"

    def to_pb(self) -> pb.ContainerState.ValueType:
        return {
            ContainerState.CREATED: pb.CONTAINER_CREATED,
            ContainerState.RUNNING: pb.CONTAINER_RUNNING,
            ContainerState.EXITED: pb.CONTAINER_EXITED,
        }[self]


class SandboxState(enum.Enum):
    READY = "ready"
    NOTREADY = "notready"

    def to_pb(self) -> pb.PodSandboxState.ValueType:
        return pb.SANDBOX_READY if self is SandboxState.READY else pb.SANDBOX_NOTREADY


@dataclass(frozen=True)
class StartInfo:
    """Written by the monitor once the container's exec succeeded."""

    monitor_pid: int
    monitor_ticks: int
    pid: int
    pid_ticks: int
    started_at: int  # unix ns


@dataclass(frozen=True)
class ExitInfo:
    exit_code: int
    finished_at: int  # unix ns
    reason: str
    message: str


@dataclass(frozen=True)
class SandboxNetwork:
    """A sandbox's own network namespace (``networkPlugin: cni``): its path, and the IPs CNI
    gave it once the setup finished (``ready``; a record journaled before the setup and never
    made ready is torn down at the next start, cni.py)."""

    netns: str
    ips: tuple[str, ...] = ()
    ready: bool = False


@dataclass(frozen=True)
class Sandbox:
    id: str
    config: pb.PodSandboxConfig
    created_at: int
    state: SandboxState
    runtime_handler: str = ""
    network: SandboxNetwork | None = None  # None: the node's network


@dataclass(frozen=True)
class Container:
    id: str
    sandbox_id: str
    config: pb.ContainerConfig
    created_at: int
    log_path: str  # absolute, or "" for no log
    image_ref: str
    started: StartInfo | None = None
    exited: ExitInfo | None = None

    @property
    def state(self) -> ContainerState:
        if self.exited is not None:
            return ContainerState.EXITED
        if self.started is not None:
            return ContainerState.RUNNING
        return ContainerState.CREATED


def labels_match(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    """Every selector key is present with the same value (CRI label selectors are exact)."""
    return all(labels.get(k) == v for k, v in selector.items())
