"""CRI labels and annotations podvisor puts on sandboxes and containers (the kubelet's names),
and the log paths (``<rootDir>/pod-logs/<ns>_<name>_<uid>/<container>/<restartCount>.log``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from podvisor.common.labels import (
    CONTAINER_HASH,
    CONTAINER_NAME,
    CONTAINER_PORTS,
    GRACE_PERIOD,
    POD_NAME,
    POD_NAMESPACE,
    POD_UID,
    PRE_STOP,
    RESTART_COUNT,
    TERMINATION_MESSAGE_PATH,
    TERMINATION_MESSAGE_POLICY,
)
from podvisor.services.pod import ContainerPort, LifecycleHandler

__all__ = ["CONTAINER_HASH", "CONTAINER_NAME", "CONTAINER_PORTS", "GRACE_PERIOD", "POD_NAME",
           "POD_NAMESPACE", "POD_UID", "PRE_STOP", "RESTART_COUNT", "TERMINATION_MESSAGE_PATH",
           "TERMINATION_MESSAGE_POLICY"]


def parse_int(text: str | None, default: int = 0) -> int:
    try:
        return int(text) if text else default
    except ValueError:
        return default


def pod_labels(name: str, namespace: str, uid: str) -> dict[str, str]:
    return {POD_UID: uid, POD_NAME: name, POD_NAMESPACE: namespace}


def container_labels(name: str, namespace: str, uid: str, container: str) -> dict[str, str]:
    return {**pod_labels(name, namespace, uid), CONTAINER_NAME: container}


def container_annotations(spec_hash: str, restart_count: int, grace: int,
                          pre_stop: LifecycleHandler | None = None,
                          termination: tuple[str, str] | None = None,
                          ports: Sequence[ContainerPort] = ()) -> dict[str, str]:
    """``termination``: the container's terminationMessagePath and terminationMessagePolicy
    (where PLEG finds an exited container's message). ``pre_stop`` and ``ports`` are recorded
    as the kubelet records them, so a container whose spec is gone still gets its preStop hook
    (``services.pod.recorded``)."""
    out = {CONTAINER_HASH: spec_hash, RESTART_COUNT: str(restart_count),
           GRACE_PERIOD: str(grace)}
    if termination is not None:
        out[TERMINATION_MESSAGE_PATH], out[TERMINATION_MESSAGE_POLICY] = termination
    if pre_stop is not None:
        out[PRE_STOP] = json.dumps({pre_stop.KIND: pre_stop.to_dict()}, sort_keys=True)
    if ports:
        out[CONTAINER_PORTS] = json.dumps([p.to_dict() for p in ports], sort_keys=True)
    return out


def pod_log_dir(pod_logs_root: Path, name: str, namespace: str, uid: str) -> Path:
    return pod_logs_root / f"{namespace}_{name}_{uid}"


def container_log_path(container: str, restart_count: int) -> str:
    """Relative to the sandbox's log directory, as CRI wants it."""
    return f"{container}/{restart_count}.log"
