"""CRI labels and annotations podvisor puts on sandboxes and containers (the kubelet's names),
and the log paths (``<rootDir>/pod-logs/<ns>_<name>_<uid>/<container>/<restartCount>.log``)."""

from __future__ import annotations

from pathlib import Path

POD_UID = "io.kubernetes.pod.uid"
POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
CONTAINER_NAME = "io.kubernetes.container.name"
CONTAINER_HASH = "io.kubernetes.container.hash"
RESTART_COUNT = "io.kubernetes.container.restartCount"
GRACE_PERIOD = "io.kubernetes.pod.terminationGracePeriod"


def parse_int(text: str | None, default: int = 0) -> int:
    try:
        return int(text) if text else default
    except ValueError:
        return default


def pod_labels(name: str, namespace: str, uid: str) -> dict[str, str]:
    return {POD_UID: uid, POD_NAME: name, POD_NAMESPACE: namespace}


def container_labels(name: str, namespace: str, uid: str, container: str) -> dict[str, str]:
    return {**pod_labels(name, namespace, uid), CONTAINER_NAME: container}


def container_annotations(spec_hash: str, restart_count: int, grace: int) -> dict[str, str]:
    return {CONTAINER_HASH: spec_hash, RESTART_COUNT: str(restart_count),
            GRACE_PERIOD: str(grace)}


def pod_log_dir(pod_logs_root: Path, name: str, namespace: str, uid: str) -> Path:
    return pod_logs_root / f"{namespace}_{name}_{uid}"


def container_log_path(container: str, restart_count: int) -> str:
    """Relative to the sandbox's log directory, as CRI wants it."""
    return f"{container}/{restart_count}.log"
