"""``disk`` faults (issue 28): a pod's emptyDir full, or failing writes, through a small
filesystem the fault mounts over it inside the pod's containers, never the machine's.

A container sees its emptyDir through a bind mount in its own mount namespace (private
propagation: a mount on the host path would never reach it), so the fault is made there: for
every mount namespace of the pod whose ``/proc/<pid>/mountinfo`` shows the volume
(``.../pods/<uid>/volumes/kubernetes.io~empty-dir/<name>``, at the container's mountPath),
``nsenter -m`` mounts a tmpfs (``podvisor-fault``) over the mountPath, sized to what the volume
holds plus ``amount`` KiB; the volume's files are copied in from the host path through
``/proc/<pid>/root`` (the container's view, seen from the host), then ``full`` fills what is
left with a ballast file (writes fail with ENOSPC) and ``readonly`` remounts it read-only
(EROFS). When it ends: read-write again, the ballast removed, the files copied back to the
host path (what the container managed to write meanwhile is kept), the tmpfs unmounted. The
host path itself is never mounted over: the node's own view of the pod does not change.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DiskFault", "volume_mounts"]

BALLAST = ".podvisor-fault-ballast"
PAGE = 4096


@dataclass(frozen=True)
class VolumeMount:
    pid: int  # a process in the mount namespace
    ns: int  # the namespace's inode
    path: str  # the mountPath in it


def volume_mounts(uid: str, volume: str) -> list[VolumeMount]:
    """One per mount namespace that mounts emptyDir ``volume`` of pod ``uid``."""
    suffix = f"/pods/{uid}/volumes/kubernetes.io~empty-dir/{volume}"
    found: dict[int, VolumeMount] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        with contextlib.suppress(OSError):
            ns = os.stat(f"/proc/{pid}/ns/mnt").st_ino
            if ns in found:
                continue
            for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
                fields = line.split()
                if len(fields) > 4 and fields[3].endswith(suffix):
                    found[ns] = VolumeMount(pid, ns, fields[4])
                    break
    return list(found.values())


def _size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def _nsenter(pid: int, *argv: str) -> None:
    subprocess.run(["nsenter", "-t", str(pid), "-m", "--", *argv], check=True,
                   capture_output=True, timeout=30)


class DiskFault:
    """Applied at construction (OSError or CalledProcessError when it cannot be: then nothing
    is left mounted); ``end()`` undoes it, idempotent."""

    def __init__(self, host_path: Path, mounts: list[VolumeMount], action: str,
                 headroom_kib: int) -> None:
        self.host_path = host_path
        self.action = action
        self.done: list[VolumeMount] = []
        size = _size(host_path) + headroom_kib * 1024 + 16 * PAGE
        mode = oct(os.stat(host_path).st_mode & 0o7777)[2:]
        try:
            for m in mounts:
                _nsenter(m.pid, "mount", "-t", "tmpfs", "-o", f"size={size},mode={mode}",
                         "podvisor-fault", m.path)
                self.done.append(m)
                view = Path(f"/proc/{m.pid}/root") / m.path.lstrip("/")
                shutil.copytree(host_path, view, symlinks=True, dirs_exist_ok=True)
                if action == "full":
                    self._fill(view / BALLAST)
                else:
                    _nsenter(m.pid, "mount", "-o", "remount,ro", m.path)
        except (OSError, subprocess.SubprocessError):
            self.end()
            raise

    @staticmethod
    def _fill(path: Path) -> None:
        chunk = b"\0" * (64 * 1024)
        with path.open("wb", buffering=0) as out:
            try:
                while True:
                    out.write(chunk)
            except OSError:
                pass
            with contextlib.suppress(OSError):  # the last pages, to the byte
                while True:
                    out.write(b"\0" * PAGE)

    def end(self) -> None:
        while self.done:
            m = self.done.pop()
            view = Path(f"/proc/{m.pid}/root") / m.path.lstrip("/")
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                if self.action == "readonly":
                    _nsenter(m.pid, "mount", "-o", "remount,rw", m.path)
                (view / BALLAST).unlink(missing_ok=True)
                shutil.copytree(view, self.host_path, symlinks=True, dirs_exist_ok=True)
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                _nsenter(m.pid, "umount", "-l", m.path)
