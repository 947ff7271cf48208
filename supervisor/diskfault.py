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

``StateFault``: the node's own state (``rootDir/state``: statuses, probes, the events, the API
source's resume point, image GC's metrics) full or read-only, in the supervisor's (and its
children's) mount namespace. ``readonly``: ``state`` bound over itself read-only (EROFS on every
new open for writing; nothing to copy: it is the same directory). ``full``: ``state`` bound to
``run/faults/disk-<n>/lower``, a small tmpfs mounted beside it and filled with a ballast file
(``amount`` KiB left free), and an overlay (``lowerdir`` the bind, ``upperdir`` on that tmpfs)
mounted over ``state``: every file reads as before, and any write (a new file, or the copy-up
of an old one) needs room the tmpfs lacks (ENOSPC). A process that keeps a file there open
(the status store's journal) is told through the faults file (``rootDir`` faults are aimed at
every process) and reopens it, at the start and at the end. At the end the overlay is unmounted
and what did get written to its upper layer goes back into ``state`` (files not written since
by the node, whiteouts as removals), then the tmpfs and the bind are unmounted. ``logs/``,
``runtime/`` (the embedded runtime's own journal, its network namespaces' bind mounts) and
``pods/`` are left alone: the fault is the node's persisted state, not its containers'.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DiskFault", "StateFault", "volume_mounts"]

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


def _mount(*argv: str) -> None:
    subprocess.run(["mount", *argv], check=True, capture_output=True, timeout=30)


def _umount(path: Path) -> None:
    """Unmount ``path`` (lazily when it is busy); never raises."""
    try:
        subprocess.run(["umount", str(path)], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["umount", "-l", str(path)], check=True, capture_output=True,
                           timeout=30)


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


class StateFault:
    """``rootDir/state`` full or read-only (module docstring). Applied at construction
    (OSError or CalledProcessError when it cannot be: then nothing is left mounted); ``end()``
    undoes it, idempotent."""

    def __init__(self, state: Path, work: Path, action: str, headroom_kib: int) -> None:
        self.state = state
        self.work = work
        self.action = action
        self.mounted: list[Path] = []  # unmounted last first
        self._overlay = False
        try:
            if action == "readonly":
                _mount("--bind", str(state), str(state))
                self.mounted.append(state)
                _mount("-o", "remount,bind,ro", str(state))
            else:
                self._full(headroom_kib)
        except (OSError, subprocess.SubprocessError):
            self.end()
            raise

    def _full(self, headroom_kib: int) -> None:
        lower, tmp = self.work / "lower", self.work / "tmp"
        lower.mkdir(parents=True)
        tmp.mkdir()
        _mount("--bind", str(self.state), str(lower))
        self.mounted.append(lower)
        size = headroom_kib * 1024 + 64 * PAGE
        _mount("-t", "tmpfs", "-o", f"size={size},mode=700", "podvisor-fault", str(tmp))
        self.mounted.append(tmp)
        upper = tmp / "upper"
        upper.mkdir(mode=os.stat(self.state).st_mode & 0o7777)
        (tmp / "work").mkdir()
        _mount("-t", "overlay", "-o",
               f"lowerdir={lower},upperdir={upper},workdir={tmp / 'work'}",
               "podvisor-fault", str(self.state))
        self.mounted.append(self.state)
        self._overlay = True
        ballast = tmp / BALLAST
        DiskFault._fill(ballast)
        if headroom_kib:
            with ballast.open("r+b") as out:
                out.truncate(max(0, ballast.stat().st_size - headroom_kib * 1024))

    def end(self) -> None:
        while self.mounted:
            path = self.mounted.pop()
            _umount(path)
            if path == self.state and self._overlay:
                self._overlay = False
                with contextlib.suppress(OSError):
                    self._copy_back(self.work / "tmp" / "upper", self.state)
        shutil.rmtree(self.work, ignore_errors=True)

    @staticmethod
    def _copy_back(upper: Path, state: Path) -> None:
        """What the overlay's upper layer holds, into ``state``: files (unless the node wrote
        that file again since, directly), directories, and whiteouts as removals."""
        for root, dirs, files in os.walk(upper):
            rel = Path(root).relative_to(upper)
            for name in dirs:
                (state / rel / name).mkdir(exist_ok=True)
            for name in files:
                src, dst = Path(root) / name, state / rel / name
                if name == BALLAST and not rel.parts:
                    continue
                with contextlib.suppress(OSError):
                    st = os.lstat(src)
                    if _is_whiteout(st):
                        if dst.is_dir() and not dst.is_symlink():
                            shutil.rmtree(dst, ignore_errors=True)
                        else:
                            dst.unlink(missing_ok=True)
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        if os.lstat(dst).st_mtime_ns > st.st_mtime_ns:
                            continue  # written again after the overlay went: newer
                    tmp = dst.with_name(f".{name}.podvisor-fault")
                    shutil.copy2(src, tmp, follow_symlinks=False)
                    os.replace(tmp, dst)
