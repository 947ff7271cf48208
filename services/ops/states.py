"""supervisord's codes (its ``supervisor/states.py``) for the ops port, as data.

The process states and the fault codes are the control protocol's
(``podvisor.ipc.control``: ``ProcessState`` carries supervisord's names and numbers, ``Fault``
its ``xmlrpc.Faults``); here: supervisord's ``SupervisorStates``, the state groups its methods
use, and ``container_state()``, which derives a container's supervisord state from its
Kubernetes ``ContainerStatus`` through the ``WAITING_STATES`` table (see docs/ARCHITECTURE.md,
"The ops port", for the whole mapping).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from podvisor.ipc.control import ProcessState
from podvisor.ipc.podstatus import ContainerStatus

__all__ = [
    "RUNNING_STATES",
    "STOPPED_STATES",
    "WAITING_STATES",
    "SupervisorState",
    "container_state",
]


class SupervisorState(enum.IntEnum):
    """supervisord's ``SupervisorStates`` (``getState``)."""

    FATAL = 2
    RUNNING = 1
    RESTARTING = 0
    SHUTDOWN = -1


RUNNING_STATES = frozenset({ProcessState.RUNNING, ProcessState.BACKOFF, ProcessState.STARTING})
STOPPED_STATES = frozenset({ProcessState.STOPPED, ProcessState.EXITED, ProcessState.FATAL,
                            ProcessState.UNKNOWN})

# A waiting container: the kubelet's reasons that mean "will be (re)started after a delay" are
# BACKOFF; every other waiting reason (ContainerCreating, PodInitializing, ...) is STARTING.
WAITING_STATES: Mapping[str, ProcessState] = {
    "CrashLoopBackOff": ProcessState.BACKOFF,
    "ImagePullBackOff": ProcessState.BACKOFF,
    "ErrImagePull": ProcessState.BACKOFF,
    "CreateContainerError": ProcessState.BACKOFF,
    "CreateContainerConfigError": ProcessState.BACKOFF,
    "RunContainerError": ProcessState.BACKOFF,
    "InvalidImageName": ProcessState.FATAL,
    "ErrImageNeverPull": ProcessState.FATAL,
}


def container_state(status: ContainerStatus | None, terminal: bool) -> ProcessState:
    """A container's supervisord state from its ``ContainerStatus`` (None: none reported yet).

    ``terminal``: the pod's restartPolicy will not restart it (Never; OnFailure after exit 0),
    so a terminated container that exited non-zero is FATAL, and one that exited 0 is EXITED."""
    if status is None:
        return ProcessState.STARTING
    state = status.state
    if state.running is not None:
        return ProcessState.RUNNING
    if state.terminated is not None:
        failed = terminal and state.terminated.exit_code
        return ProcessState.FATAL if failed else ProcessState.EXITED
    return WAITING_STATES.get(state.reason, ProcessState.STARTING)
