"""Which containers never ran through no fault of their own (``lost_attempt``): shared by the
two action paths (``actions.py``, and ``initactions.py`` for init containers and sidecars),
pure. Such an attempt is no failure of the pod: it is made again in its place, with no back-off
and no restart counted (docs/ARCHITECTURE.md, "Exactly once")."""

from __future__ import annotations

from podvisor.services.syncloop.runtime_state import ContainerInfo, ContainerState

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
