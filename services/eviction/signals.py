"""The eviction signals and where they are read (the kubelet's ``eviction/helpers.go``
``makeSignalObservations`` and ``summary`` provider, over files instead of cadvisor).

- ``memory.available``: the node's memory less the working set of the pods' cgroup root
  (``cgroupRoot`` under the memory controller, v1 or v2: ``cgroups.py``); the node's memory is
  ``MemTotal``, or the memory limit of that folder or of a folder above it when lower (a node
  inside a limited cgroup).
- ``nodefs.available`` / ``nodefs.inodesFree``: ``statvfs`` of ``rootDir`` (blocks available to
  unprivileged users, free inodes); ``imagefs.*``: ``statvfs`` of the runtime's image
  filesystem (CRI ``ImageFsInfo``; rootDir's when the runtime does not say).
- ``pid.available``: ``kernel.pid_max`` less the processes now (``/proc/loadavg``).

``Observation`` is a value (available, capacity) per signal; ``NodeSources`` reads them, each
source injectable (a test points the memory figures at a cgroup it made and the disk at a small
filesystem it mounted).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from podvisor.services.eviction.cgroups import MemoryCgroups

MEMORY, ALLOC_MEMORY = "memory.available", "allocatableMemory.available"
NODEFS, NODEFS_INODES = "nodefs.available", "nodefs.inodesFree"
IMAGEFS, IMAGEFS_INODES = "imagefs.available", "imagefs.inodesFree"
PIDS = "pid.available"


@dataclass(frozen=True)
class Observation:
    """One signal: what is available and of how much (bytes, inodes or PIDs)."""

    available: int
    capacity: int


Observations = Mapping[str, Observation]


def _int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def mem_total(meminfo: Path = Path("/proc/meminfo")) -> int:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def memory_observation(cgroups: MemoryCgroups, folder: Path, total: int) -> Observation:
    limit = cgroups.limit(folder)
    capacity = min(total, limit) if limit is not None and total else (limit or total)
    return Observation(max(0, capacity - cgroups.working_set(folder)), capacity)


def fs_observations(path: str) -> tuple[Observation, Observation]:
    """(bytes, inodes) of the filesystem holding ``path``."""
    st = os.statvfs(path)
    return (Observation(st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize),
            Observation(st.f_favail, st.f_files))


def pid_observation(proc: Path = Path("/proc")) -> Observation:
    pid_max = _int(proc / "sys/kernel/pid_max") or 0
    try:
        running = int((proc / "loadavg").read_text().split()[3].split("/")[1])
    except (OSError, ValueError, IndexError):
        running = 0
    return Observation(max(0, pid_max - running), pid_max)


@dataclass
class NodeSources:
    """Where the signals are read: ``memory`` (the folder whose working set counts, and the
    node's memory), ``nodefs`` (a path on rootDir's filesystem) and ``imagefs`` (a callable:
    the image filesystem's path, asked at each pass)."""

    cgroups: MemoryCgroups
    memory: Path
    total_memory: Callable[[], int]
    nodefs: str
    imagefs: Callable[[], str]
    pids: Callable[[], Observation] = pid_observation

    def observe(self) -> dict[str, Observation]:
        out: dict[str, Observation] = {}
        mem = memory_observation(self.cgroups, self.memory, self.total_memory())
        if mem.capacity:
            out[MEMORY] = out[ALLOC_MEMORY] = mem
        with contextlib.suppress(OSError):
            out[NODEFS], out[NODEFS_INODES] = fs_observations(self.nodefs)
        with contextlib.suppress(OSError):
            out[IMAGEFS], out[IMAGEFS_INODES] = fs_observations(self.imagefs() or self.nodefs)
        pids = self.pids()
        if pids.capacity:
            out[PIDS] = pids
        return out
