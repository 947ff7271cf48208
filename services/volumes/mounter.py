"""Mounts on the node: the ``Mounter`` interface, the host's (mount(2)/umount2(2) through libc,
``/proc/self/mountinfo`` for what is mounted) and a fake for unit tests.

The volume manager binds a ``local`` PersistentVolume's directory into the pod's volume folder
and asks whether a path is a mount point (reconstruction, teardown); CSI drivers make their own
mounts (the CSI spec: the plugin mounts at the staging and target paths). Thread-safe (the host
one holds no state; the fake takes a lock).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from typing import Protocol

from podvisor.common.mountinfo import MountPoint, parse_mountinfo

MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 1, 32, 4096, 16384
MNT_DETACH = 2
__all__ = ["FakeMounter", "HostMounter", "MountPoint", "Mounter", "is_mount_point",
           "mounts_under", "parse_mountinfo"]


class Mounter(Protocol):
    def mounts(self) -> list[MountPoint]:
        """What is mounted now (the process's mount namespace)."""
        ...

    def bind(self, source: str, target: str, read_only: bool) -> None:
        """Bind ``source`` on the existing ``target`` (read-only: a second, remounting call).
        Raises OSError."""
        ...

    def unmount(self, target: str) -> None:
        """Unmount ``target`` (every mount stacked there). Raises OSError (EINVAL: not a
        mount point)."""
        ...


def is_mount_point(mounter: Mounter, path: str) -> bool:
    real = os.path.realpath(path)
    return any(m.path == real for m in mounter.mounts())


def mounts_under(mounter: Mounter, prefix: str) -> list[MountPoint]:
    """The mounts at or below ``prefix`` (resolved), deepest last as mounted."""
    real = os.path.realpath(prefix).rstrip("/")
    return [m for m in mounter.mounts() if m.path == real or m.path.startswith(real + "/")]


class HostMounter:
    """mount(2) and umount2(2) through libc (needs CAP_SYS_ADMIN)."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

    def mounts(self) -> list[MountPoint]:
        with open("/proc/self/mountinfo") as f:
            return parse_mountinfo(f.read())

    def _mount(self, source: str | None, target: str, flags: int) -> None:
        rc = self._libc.mount(source.encode() if source else None, target.encode(), None,
                              ctypes.c_ulong(flags), None)
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {source or ''} on {target}: {os.strerror(err)}", target)

    def bind(self, source: str, target: str, read_only: bool) -> None:
        self._mount(source, target, MS_BIND | MS_REC)
        if read_only:
            try:
                self._mount(None, target, MS_BIND | MS_REMOUNT | MS_RDONLY)
            except OSError:
                self.unmount(target)
                raise

    def unmount(self, target: str) -> None:
        while True:
            rc = self._libc.umount2(target.encode(), 0)
            if rc != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"unmount {target}: {os.strerror(err)}", target)
            if not is_mount_point(self, target):
                return


class FakeMounter:
    """A mount table in memory: ``bind`` records, ``unmount`` forgets; ``fail`` maps a target
    to the OSError its next call raises (the knob for errors)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.table: list[MountPoint] = []
        self.calls: list[tuple[str, str]] = []
        self.fail: dict[str, OSError] = {}

    def mounts(self) -> list[MountPoint]:
        with self._lock:
            return list(self.table)

    def bind(self, source: str, target: str, read_only: bool) -> None:
        with self._lock:
            self.calls.append(("bind", target))
            if (err := self.fail.pop(target, None)) is not None:
                raise err
            self.table.append(MountPoint(os.path.realpath(target), source, "none", source,
                                         "ro" if read_only else "rw"))

    def unmount(self, target: str) -> None:
        real = os.path.realpath(target)
        with self._lock:
            self.calls.append(("unmount", target))
            if (err := self.fail.pop(target, None)) is not None:
                raise err
            if not any(m.path == real for m in self.table):
                raise OSError(22, f"unmount {target}: not mounted", target)
            self.table = [m for m in self.table if m.path != real]
