"""Container log rotation, as the kubelet's container log manager does it (KUBELET.md "Images,
pulls and logs"): every 10 s, each running container whose log file has passed
``containerLogMaxSize`` gets its rotated files beyond ``containerLogMaxFiles`` removed, every
rotated file but the newest gzipped, the live file renamed to ``<log>.<YYYYmmdd-HHMMSS>``, and
CRI ReopenContainerLog (the runtime then writes a new file at the old path). A failed reopen
renames the file back. Reading across the rotation: ``podvisor.common.crilog``."""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
from pathlib import Path

from podvisor.common.crilog import rotated_files
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


def rotate_pass(cri: RuntimeClient, max_size: int, max_files: int, stamp: str,
                log: Log) -> int:
    """Every running container's log; returns how many rotated."""
    from cri_api.v1 import api_pb2 as pb

    done = 0
    for c in cri.list_containers(pb.ContainerFilter(
            state=pb.ContainerStateValue(state=pb.CONTAINER_RUNNING))):
        try:
            path = cri.container_status(c.id).log_path
            if path and rotate_log(cri, c.id, Path(path), max_size, max_files, stamp):
                done += 1
                log.info("imagegc.log.rotated", container_id=c.id, container=c.metadata.name,
                         pod_uid=c.labels.get("io.kubernetes.pod.uid", ""), path=path)
        except (CriError, OSError) as err:
            log.warning("imagegc.log.rotate_failed", container_id=c.id,
                        container=c.metadata.name,
                        pod_uid=c.labels.get("io.kubernetes.pod.uid", ""), error=str(err))
    return done
