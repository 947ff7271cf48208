"""The memory figures of a cgroup on either hierarchy, as cadvisor reads them for the kubelet
(the working set is the usage less the inactive file cache), and which hierarchy this host has.

- **Which**: ``statfs`` of ``/sys/fs/cgroup``: ``cgroup2fs`` (``CGROUP2_SUPER_MAGIC``) is the
  unified v2 hierarchy, anything else (tmpfs holding the v1 controllers' mounts) v1: runc's
  ``IsCgroup2UnifiedMode``. Memory folders are under ``/sys/fs/cgroup`` on v2, under
  ``/sys/fs/cgroup/memory`` on v1.
- **v1**: usage ``memory.usage_in_bytes``, inactive ``total_inactive_file`` of ``memory.stat``,
  limit ``memory.limit_in_bytes`` (a value this large, ``UNLIMITED``, is none).
- **v2**: usage ``memory.current``, inactive ``inactive_file`` of ``memory.stat``, limit
  ``memory.max`` (``max``: none). The root has no ``memory.current``: its usage is ``MemTotal``
  less ``MemFree`` of ``/proc/meminfo`` (runc's ``rootStatsFromMeminfo``), its inactive file
  that of the root's ``memory.stat``.

The limit is the lowest of the folder's and of every folder above it up to the mount (a node
inside a limited cgroup). A folder that does not exist reads as 0 usage and no limit.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP2_SUPER_MAGIC = 0x63677270
UNLIMITED = 1 << 62  # a v1 memory.limit_in_bytes this large means no limit


class _Statfs(ctypes.Structure):
    # struct statfs (Linux, 64-bit): f_type first, as a native long; the rest is only room
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 120)]


def statfs_type(path: Path) -> int:
    """``statfs(2)``'s ``f_type`` of ``path`` (the filesystem's magic number); -1 when it
    cannot be read."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    buf = _Statfs()
    if libc.statfs(os.fsencode(path), ctypes.byref(buf)) != 0:
        return -1
    return int(buf.f_type) & 0xFFFFFFFF


def _int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _meminfo(meminfo: Path, key: str) -> int:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


@dataclass(frozen=True)
class MemoryCgroups:
    """The memory controller's folders on one hierarchy: ``version`` 1 or 2, ``mount`` the
    folder the cgroup paths are under."""

    version: int
    mount: Path
    meminfo: Path = Path("/proc/meminfo")

    def folder(self, cgroup: str) -> Path:
        """The folder of a cgroup path (``/kubepods/pod<uid>``; '' or '/': the mount)."""
        return self.mount / cgroup.strip("/") if cgroup.strip("/") else self.mount

    def usage(self, folder: Path) -> int | None:
        if self.version == 1:
            return _int(folder / "memory.usage_in_bytes")
        current = _int(folder / "memory.current")
        if current is None and folder == self.mount:
            total = _meminfo(self.meminfo, "MemTotal")
            return total - _meminfo(self.meminfo, "MemFree") if total else None
        return current

    def working_set(self, folder: Path) -> int:
        """Usage less the inactive file cache (cadvisor's working set); 0 for a folder that
        does not exist (no pod ran yet)."""
        usage = self.usage(folder)
        if usage is None:
            return 0
        key = "total_inactive_file" if self.version == 1 else "inactive_file"
        return max(0, usage - _stat(folder / "memory.stat", key))

    def own_limit(self, folder: Path) -> int | None:
        if self.version == 1:
            limit = _int(folder / "memory.limit_in_bytes")
            return limit if limit is not None and limit < UNLIMITED else None
        try:
            text = (folder / "memory.max").read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None  # "max": no limit

    def limit(self, folder: Path) -> int | None:
        """The lowest limit of ``folder`` and the folders above it up to the mount (None:
        no limit)."""
        lowest: int | None = None
        here = folder
        while True:
            limit = self.own_limit(here)
            if limit is not None:
                lowest = limit if lowest is None else min(lowest, limit)
            if here == self.mount or here.parent == here or self.mount not in here.parents:
                return lowest
            here = here.parent


def detect_memory_cgroups(root: Path = CGROUP_ROOT,
                          fs_type: Callable[[Path], int] = statfs_type) -> MemoryCgroups:
    """v2 when ``root`` is a cgroup2 filesystem, else v1 (its ``memory`` controller's mount
    under ``root``)."""
    if fs_type(root) == CGROUP2_SUPER_MAGIC:
        return MemoryCgroups(2, root)
    return MemoryCgroups(1, root / "memory")
