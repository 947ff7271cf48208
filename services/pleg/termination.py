"""A terminated container's message, as the kubelet's ``convertToKubeContainerStatus`` makes it
(``kuberuntime_container.go``): the runtime's own message, then ``": "`` and what the container
left in its termination-log file (the host file mounted on ``terminationMessagePath``, found
among the ContainerStatus' mounts; at most its last 4096 bytes), or with
``terminationMessagePolicy: FallbackToLogsOnError`` and a non-zero exit (not a container that
could not even start) when the file is missing or empty, the tail of its log (the last 80
lines, at most 2048 bytes). The path and policy come from the container's annotations.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from cri_api.v1 import api_pb2 as pb

from podvisor.common import labels
from podvisor.common.crilog import tail_text

MAX_MESSAGE = 4096  # MaxContainerTerminationMessageLength
LOG_LINES = 80  # MaxContainerTerminationMessageLogLines
LOG_BYTES = 2048  # MaxContainerTerminationMessageLogLength
FALLBACK = "FallbackToLogsOnError"


def _from_file(st: pb.ContainerStatus, path: str, fallback: bool) -> tuple[str, bool]:
    """(message, read the logs instead): ``getTerminationMessage``."""
    if not path:
        return "", fallback
    for mount in st.mounts:
        if mount.container_path != path:
            continue
        try:
            with open(mount.host_path, "rb") as src:
                size = os.fstat(src.fileno()).st_size
                src.seek(max(0, size - MAX_MESSAGE))
                data = src.read(MAX_MESSAGE)
        except FileNotFoundError:
            return "", fallback
        except OSError as err:
            return f"Error on reading termination log {mount.host_path}: {err}", False
        return data.decode(errors="replace"), fallback and not data
    return "", fallback


def termination_message(st: pb.ContainerStatus, annotations: Mapping[str, str]) -> str:
    """The message of ``st`` (the runtime's own while it has not exited)."""
    if st.state != pb.CONTAINER_EXITED:
        return st.message
    fallback = (annotations.get(labels.TERMINATION_MESSAGE_POLICY) == FALLBACK
                and st.exit_code != 0 and st.reason != "ContainerCannotRun")
    text, logs = _from_file(st, annotations.get(labels.TERMINATION_MESSAGE_PATH, ""),
                            fallback)
    if logs and st.log_path:
        try:
            text = tail_text(Path(st.log_path), LOG_LINES, LOG_BYTES)
        except OSError as err:
            text = f"Error on reading termination message from logs: {err}"
    if not text:
        return st.message
    return f"{st.message}: {text}" if st.message else text
