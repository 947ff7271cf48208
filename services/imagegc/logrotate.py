"""Container log rotation, as the kubelet's container log manager does it (KUBELET.md "Images,
pulls and logs"): every 10 s, each running container (as PLEG's records list it, with its log
path: the kubelet lists and inspects every container for this) whose log file has passed
``containerLogMaxSize`` gets its rotated files beyond ``containerLogMaxFiles`` removed, every
rotated file but the newest gzipped, the live file renamed to ``<log>.<YYYYmmdd-HHMMSS>``, and
CRI ReopenContainerLog (the runtime then writes a new file at the old path). A failed reopen
renames the file back. Reading across the rotation: ``podvisor.common.crilog``."""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from podvisor.common.crilog import rotated_files
from podvisor.ipc.maps import PlegContainer, PlegPod
from podvisor.services.cri import CriError, RuntimeClient
from podvisor.services.imagegc.gc import Log

ROTATE_PERIOD = 10.0
STAMP = "%Y%m%d-%H%M%S"


def _compress(path: Path) -> None:
    tmp = path.with_name(path.name + ".gz.tmp")
    with path.open("rb") as src, gzip.open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.replace(tmp, path.with_name(path.name + ".gz"))
    path.unlink()


def rotate_log(cri: RuntimeClient, container_id: str, log: Path, max_size: int,
               max_files: int, stamp: str) -> bool:
    """One container's rotation when its file is over ``max_size``; True when it rotated."""
    try:
        if log.stat().st_size <= max_size:
            return False
    except OSError:
        return False
    rotated = rotated_files(log)
    # after this rotation: the live file, the one rotated now, and at most max_files - 2 older
    for old in rotated[:max(0, len(rotated) - max(max_files - 2, 0))]:
        with contextlib.suppress(OSError):
            old.unlink()
    for old in rotated_files(log):
        if not old.name.endswith(".gz"):
            _compress(old)
    target = log.with_name(f"{log.name}.{stamp}")
    n = 0
    while target.exists():  # two rotations within one second
        n += 1
        target = log.with_name(f"{log.name}.{stamp}{n:02d}")
    os.rename(log, target)
    try:
        cri.reopen_container_log(container_id)
    except CriError:
        with contextlib.suppress(OSError):
            os.rename(target, log)  # the runtime still writes to it: put it back
        raise
    return True


def running_logs(pleg: Mapping[str, Any]) -> list[tuple[str, PlegPod, PlegContainer]]:
    """(pod UID, pod, container) of every running container with a log file, from PLEG's
    records (``pleg`` map values; ``_health`` is skipped): the records carry the log path."""
    return [(uid, pod, c) for uid, pod in pleg.items() if isinstance(pod, PlegPod)
            for c in pod.containers if c.state == "CONTAINER_RUNNING" and c.log_path]


def rotate_pass(cri: RuntimeClient, pleg: Mapping[str, Any], max_size: int, max_files: int,
                stamp: str, log: Log) -> int:
    """Every running container's log (as PLEG last listed them: the kubelet lists and inspects
    every container each pass, ~2 CRI calls a container every 10 s that the records already
    answer); returns how many rotated. Only ReopenContainerLog goes to the runtime."""
    done = 0
    for uid, pod, c in running_logs(pleg):
        try:  # most files are under the size: a plain stat, no Path built
            if os.stat(c.log_path).st_size <= max_size:
                continue
        except OSError:
            continue
        where = {"pod": f"{pod.name}_{pod.namespace}", "pod_uid": uid, "container": c.name,
                 "container_id": c.id}
        try:
            if rotate_log(cri, c.id, Path(c.log_path), max_size, max_files, stamp):
                done += 1
                log.info("imagegc.log.rotated", path=c.log_path, **where)
        except (CriError, OSError) as err:
            log.warning("imagegc.log.rotate_failed", error=str(err), **where)
    return done
