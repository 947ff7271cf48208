"""CRI labels and annotations podvisor puts on sandboxes and containers (the kubelet's names),
and the log paths (``<rootDir>/pod-logs/<ns>_<name>_<uid>/<container>/<restartCount>.log``)."""

from __future__ import annotations

from pathlib import Path

from podvisor.common.labels import (
    CONTAINER_HASH,
    CONTAINER_NAME,
    GRACE_PERIOD,
    POD_NAME,
    POD_NAMESPACE,
    POD_UID,
    RESTART_COUNT,
)

__all__ = ["CONTAINER_HASH", "CONTAINER_NAME", "GRACE_PERIOD", "POD_NAME", "POD_NAMESPACE",
           "POD_UID", "RESTART_COUNT"]


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
