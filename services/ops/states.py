"""supervisord's codes (its ``supervisor/states.py`` and ``xmlrpc.Faults``), as data.

Dependency-free. ``AGENT_STATES`` maps the supervisor's process states (same names as
supervisord's) to codes; ``container_state()`` derives a container's supervisord state from its
Kubernetes ``ContainerStatus`` through the ``WAITING_STATES`` table (see docs/ARCHITECTURE.md,
"The ops port", for the whole mapping).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from podvisor.ipc.podstatus import ContainerStatus

__all__ = [
    "AGENT_STATES",
    "WAITING_STATES",
    "Fault",
    "ProcState",
    "SupervisorState",
    "container_state",
]


class ProcState(enum.IntEnum):
    """supervisord's ``ProcessStates``."""

    STOPPED = 0
    STARTING = 10
    RUNNING = 20
    BACKOFF = 30
    STOPPING = 40
    EXITED = 100
    FATAL = 200
    UNKNOWN = 1000


class SupervisorState(enum.IntEnum):
    """supervisord's ``SupervisorStates`` (``getState``)."""

    FATAL = 2
    RUNNING = 1
    RESTARTING = 0
    SHUTDOWN = -1


class Fault(enum.IntEnum):
    """supervisord's ``xmlrpc.Faults``: the XML-RPC fault codes, and the fault string is
    ``NAME: detail`` as supervisord writes it."""

    UNKNOWN_METHOD = 1
    INCORRECT_PARAMETERS = 2
    BAD_ARGUMENTS = 3
    SIGNATURE_UNSUPPORTED = 4
    SHUTDOWN_STATE = 6
    BAD_NAME = 10
    BAD_SIGNAL = 11
    NO_FILE = 20
    NOT_EXECUTABLE = 21
    FAILED = 30
    ABNORMAL_TERMINATION = 40
    SPAWN_ERROR = 50
    ALREADY_STARTED = 60
    NOT_RUNNING = 70
    SUCCESS = 80
    ALREADY_ADDED = 90
    STILL_RUNNING = 91
    CANT_REREAD = 92


RUNNING_STATES = frozenset({ProcState.RUNNING, ProcState.BACKOFF, ProcState.STARTING})
STOPPED_STATES = frozenset({ProcState.STOPPED, ProcState.EXITED, ProcState.FATAL,
                            ProcState.UNKNOWN})

# The supervisor's ProcessState values carry supervisord's names one to one.
AGENT_STATES: Mapping[str, ProcState] = {s.name: s for s in ProcState}

# A waiting container: the kubelet's reasons that mean "will be (re)started after a delay" are
# BACKOFF; every other waiting reason (ContainerCreating, PodInitializing, ...) is STARTING.
WAITING_STATES: Mapping[str, ProcState] = {
    "CrashLoopBackOff": ProcState.BACKOFF,
    "ImagePullBackOff": ProcState.BACKOFF,
    "ErrImagePull": ProcState.BACKOFF,
    "CreateContainerError": ProcState.BACKOFF,
    "CreateContainerConfigError": ProcState.BACKOFF,
    "RunContainerError": ProcState.BACKOFF,
    "InvalidImageName": ProcState.FATAL,
    "ErrImageNeverPull": ProcState.FATAL,
}


def container_state(status: ContainerStatus | None, terminal: bool) -> ProcState:
    """A container's supervisord state from its ``ContainerStatus`` (None: none reported yet).

    ``terminal``: the pod's restartPolicy will not restart it (Never; OnFailure after exit 0),
    so a terminated container that exited non-zero is FATAL, and one that exited 0 is EXITED."""
    if status is None:
        return ProcState.STARTING
    state = status.state
    if state.running is not None:
        return ProcState.RUNNING
    if state.terminated is not None:
        return ProcState.FATAL if terminal and state.terminated.exit_code else ProcState.EXITED
    return WAITING_STATES.get(state.reason, ProcState.STARTING)
