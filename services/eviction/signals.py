"""The eviction signals and where they are read (the kubelet's ``eviction/helpers.go``
``makeSignalObservations`` and ``summary`` provider, over files instead of cadvisor).

- ``memory.available``: the node's memory less the working set of the pods' cgroup root
  (``cgroupRoot`` under the memory controller: ``memory.usage_in_bytes`` less
  ``total_inactive_file``); the node's memory is ``MemTotal``, or the memory limit of that
  folder or of a folder above it when lower (a node inside a limited cgroup).
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

MEMORY_CGROUP_MOUNT = Path("/sys/fs/cgroup/memory")
UNLIMITED = 1 << 62  # a v1 memory.limit_in_bytes this large means no limit

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


def cgroup_limit(folder: Path, mount: Path = MEMORY_CGROUP_MOUNT) -> int | None:
    """The lowest ``memory.limit_in_bytes`` of ``folder`` and the folders above it up to
    ``mount`` (None: no limit)."""
    lowest: int | None = None
    here = folder
    while True:
        limit = _int(here / "memory.limit_in_bytes")
        if limit is not None and limit < UNLIMITED:
            lowest = limit if lowest is None else min(lowest, limit)
        if here == mount or here.parent == here or mount not in here.parents:
            return lowest
        here = here.parent


def working_set(folder: Path) -> int:
    """``memory.usage_in_bytes`` less ``total_inactive_file`` (cadvisor's working set); 0 for a
    folder that does not exist (no pod ran yet)."""
    usage = _int(folder / "memory.usage_in_bytes")
    if usage is None:
        return 0
    inactive = 0
    try:
        for line in (folder / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "total_inactive_file":
                inactive = int(value)
    except (OSError, ValueError):
        pass
    return max(0, usage - inactive)


def memory_folder(cgroup_root: str, mount: Path = MEMORY_CGROUP_MOUNT) -> Path:
    """The pods' cgroup root under the memory controller (the mount itself when '')."""
    return mount / cgroup_root.strip("/") if cgroup_root.strip("/") else mount


def memory_observation(folder: Path, total: int,
                       mount: Path = MEMORY_CGROUP_MOUNT) -> Observation:
    limit = cgroup_limit(folder, mount)
    capacity = min(total, limit) if limit is not None and total else (limit or total)
    return Observation(max(0, capacity - working_set(folder)), capacity)


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

    memory: Path
    total_memory: Callable[[], int]
    nodefs: str
    imagefs: Callable[[], str]
    mount: Path = MEMORY_CGROUP_MOUNT
    pids: Callable[[], Observation] = pid_observation

    def observe(self) -> dict[str, Observation]:
        out: dict[str, Observation] = {}
        mem = memory_observation(self.memory, self.total_memory(), self.mount)
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
