"""CRI labels and annotations podvisor puts on sandboxes and containers (the kubelet's names),
and the log paths (``<rootDir>/pod-logs/<ns>_<name>_<uid>/<container>/<restartCount>.log``)."""

from __future__ import annotations

import json
from pathlib import Path

from podvisor.common.labels import (
    CONTAINER_HASH,
    CONTAINER_NAME,
    GRACE_PERIOD,
    POD_NAME,
    POD_NAMESPACE,
    POD_UID,
    PRE_STOP,
    RESTART_COUNT,
    TERMINATION_MESSAGE_PATH,
    TERMINATION_MESSAGE_POLICY,
)
from podvisor.services.pod import ExecAction, LifecycleHandler, SleepAction, TCPSocketAction

__all__ = ["CONTAINER_HASH", "CONTAINER_NAME", "GRACE_PERIOD", "POD_NAME", "POD_NAMESPACE",
           "POD_UID", "PRE_STOP", "RESTART_COUNT", "TERMINATION_MESSAGE_PATH",
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
                          termination: tuple[str, str] | None = None) -> dict[str, str]:
    """``termination``: the container's terminationMessagePath and terminationMessagePolicy
    (where PLEG finds an exited container's message)."""
    out = {CONTAINER_HASH: spec_hash, RESTART_COUNT: str(restart_count),
           GRACE_PERIOD: str(grace)}
    if termination is not None:
        out[TERMINATION_MESSAGE_PATH], out[TERMINATION_MESSAGE_POLICY] = termination
    if pre_stop is not None:
        out[PRE_STOP] = json.dumps({pre_stop.KIND: pre_stop.to_dict()}, sort_keys=True)
    return out


def pre_stop_handler(text: str) -> ExecAction | SleepAction | TCPSocketAction | None:
    """The preStop handler recorded in ``PRE_STOP`` (exec, sleep and tcpSocket, which fails as
    the kubelet's runner fails it; None for anything else, a missing or a malformed one)."""
    try:
        raw = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    exec_ = raw.get("exec")
    if isinstance(exec_, dict) and isinstance(cmd := exec_.get("command"), list) and cmd \
            and all(isinstance(x, str) for x in cmd):
        return ExecAction(tuple(cmd))
    sleep = raw.get("sleep")
    if isinstance(sleep, dict) and isinstance(secs := sleep.get("seconds"), int) \
            and not isinstance(secs, bool) and secs >= 0:
        return SleepAction(secs)
    tcp = raw.get("tcpSocket")
    if isinstance(tcp, dict) and isinstance(port := tcp.get("port"), (int, str)) \
            and not isinstance(port, bool):
        return TCPSocketAction(port, str(tcp.get("host", "")))
    return None


def pod_log_dir(pod_logs_root: Path, name: str, namespace: str, uid: str) -> Path:
    return pod_logs_root / f"{namespace}_{name}_{uid}"


def container_log_path(container: str, restart_count: int) -> str:
    """Relative to the sandbox's log directory, as CRI wants it."""
    return f"{container}/{restart_count}.log"
