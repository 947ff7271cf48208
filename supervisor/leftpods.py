"""How many pods the agent leaves running when it stops without stopping them.

As with the kubelet and containerd, SIGTERM/SIGINT stop the agent's processes and leave pods
running; the agent says so on exit, with how to stop them. The count comes from the runtime (CRI
ListPodSandbox: ready sandboxes labelled with a pod UID), asked once when the shutdown begins,
while the embedded runtime still serves. gRPC is imported only here, at shutdown.
"""

from __future__ import annotations

from podvisor.common import labels
from podvisor.common.config import Config
from podvisor.common.endpoint import cri_endpoint, is_embedded
from podvisor.ipc.paths import RunPaths

__all__ = ["HINT", "count_running_pods", "left_message"]

POD_UID_LABEL = labels.POD_UID
HINT = ("stop them with `podvisorctl shutdown --pods` (or stopPodsOnExit: true / "
        "--stop-pods-on-exit); a new agent on this rootDir adopts them")


def count_running_pods(config: Config, paths: RunPaths, timeout: float = 2.0) -> int | None:
    """Ready pod sandboxes in the runtime; None when the runtime cannot be asked (0 when the
    embedded runtime has no socket: it never ran, so there are no pods)."""
    from podvisor.services.cri import CriError, RuntimeClient, new_runtime_client

    if is_embedded(config.runtime_endpoint) and not paths.cri_socket.exists():
        return 0
    endpoint = cri_endpoint(config.runtime_endpoint, paths.cri_socket)
    cri: RuntimeClient | None = None
    try:
        cri = new_runtime_client(endpoint, timeout=timeout)
        sandboxes = cri.list_pod_sandbox()
    except (CriError, OSError, ValueError):
        return None
    finally:
        if cri is not None:
            cri.close()
    return len({s.labels[POD_UID_LABEL] for s in sandboxes
                if s.state == 0 and s.labels.get(POD_UID_LABEL)})  # 0 = SANDBOX_READY


def left_message(count: int | None) -> str | None:
    """The line printed on exit, or None when nothing is left running."""
    if count is None:
        return ("podvisor: pods may still be running (the runtime could not be asked); "
                + HINT)
    if count == 0:
        return None
    noun = "pod" if count == 1 else "pods"
    return f"podvisor: left {count} {noun} running; {HINT}"
