"""How many pods the agent leaves running when it stops without stopping them.

As with the kubelet and containerd, SIGTERM/SIGINT stop the agent's processes and leave pods
running; the agent says so on exit, with how to stop them. The count comes from the runtime (CRI
ListPodSandbox: ready sandboxes labelled with a pod UID), asked once when the shutdown begins,
while the embedded runtime still serves. gRPC is imported only here, at shutdown.
"""

from __future__ import annotations

from pathlib import Path

from podvisor.common import labels
from podvisor.common.config import Config
from podvisor.common.endpoint import cri_endpoint, is_embedded
from podvisor.ipc.paths import RunPaths
from podvisor.supervisor.advice import stop_pods_command

__all__ = ["count_running_pods", "hint", "left_message"]

POD_UID_LABEL = labels.POD_UID


def hint(root: Path | str) -> str:
    return (f"stop them with `{stop_pods_command(root)}` (or stopPodsOnExit: true / "
            "--stop-pods-on-exit); a new agent on this rootDir adopts them")


def count_running_pods(config: Config, paths: RunPaths, timeout: float = 2.0) -> int | None:
    """Ready pod sandboxes in the runtime; None when the runtime cannot be asked (0 when the
    embedded runtime has no socket: it never ran, so there are no pods)."""
    from podvisor.services.cri import CriError, RuntimeClient, new_runtime_client
    from podvisor.services.syncloop import owned_pod_uids

    endpoint = config.runtime_endpoint
    # another runtime (containerd) may run other clients' pods: count only this rootDir's
    owned = owned_pod_uids(paths.pod_logs_dir) if not is_embedded(endpoint) else None
    if is_embedded(endpoint) and not paths.cri_socket.exists():
        return 0
    endpoint = cri_endpoint(endpoint, paths.cri_socket)
    cri: RuntimeClient | None = None
    try:
        cri = new_runtime_client(endpoint, timeout=timeout)
        sandboxes = cri.list_pod_sandbox()
    except (CriError, OSError, ValueError):
        return None
    finally:
        if cri is not None:
            cri.close()
    uids = {s.labels[POD_UID_LABEL] for s in sandboxes
            if s.state == 0 and s.labels.get(POD_UID_LABEL)}  # 0 = SANDBOX_READY
    return len(uids if owned is None else uids & owned)


def left_message(count: int | None, root: Path | str) -> str | None:
    """The line printed on exit, or None when nothing is left running."""
    if count is None:
        return ("podvisor: pods may still be running (the runtime could not be asked); "
                + hint(root))
    if count == 0:
        return None
    noun = "pod" if count == 1 else "pods"
    return f"podvisor: left {count} {noun} running; {hint(root)}"
