"""The filesystem effect behind pod cgroups: read mountinfo, list and rmdir folders (cleanup),
make a pod's folder and write its limits, list the processes left in a folder and kill them.

``CgroupFS`` is what ``podcgroups.PodCgroups`` needs from the host; ``new_cgroup_fs()`` is the
real one (``/proc/self/mountinfo``, ``os.scandir``, ``os.rmdir``), ``FakeCgroupFS`` an in-memory
tree for unit tests with knobs for errors. Neither ever deletes a file or a non-empty folder:
``rmdir`` is the only removal (on cgroupfs it fails with EBUSY while a cgroup has processes and
ENOTEMPTY while it has child cgroups). Both are thread-safe (the real one holds no state; the
fake takes a lock).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
from collections.abc import Iterable
from typing import Protocol

MOUNTINFO = "/proc/self/mountinfo"


class CgroupFS(Protocol):
    def mountinfo(self) -> str:
        """The text of /proc/self/mountinfo."""
        ...

    def child_dirs(self, path: str) -> list[str]:
        """Names of the folders directly in ``path`` ([] when it does not exist)."""
        ...

    def rmdir(self, path: str) -> None:
        """Remove the empty folder ``path``; raises OSError (FileNotFoundError when gone)."""
        ...

    def mkdir(self, path: str) -> None:
        """Create ``path`` and its parents (runc's MkdirAll); an existing one is fine."""
        ...

    def write(self, path: str, value: str) -> None:
        """Write ``value`` into the cgroup file ``path``; raises OSError."""
        ...

    def read(self, path: str) -> str:
        """The text of the cgroup file ``path``; raises OSError."""
        ...

    def procs(self, path: str) -> list[int]:
        """The PIDs in the cgroup folder ``path`` (its cgroup.procs; [] when it is gone)."""
        ...

    def kill(self, pid: int) -> None:
        """SIGKILL ``pid`` (one already gone is fine)."""
        ...


class _HostCgroupFS:
    def mountinfo(self) -> str:
        with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as src:
            return src.read()

    def child_dirs(self, path: str) -> list[str]:
        try:
            with os.scandir(path) as entries:
                return [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def mkdir(self, path: str) -> None:
        os.makedirs(path, 0o755, exist_ok=True)

    def write(self, path: str, value: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    def read(self, path: str) -> str:
        with open(path, encoding="utf-8") as src:
            return src.read()

    def procs(self, path: str) -> list[int]:
        try:
            return [int(p) for p in self.read(os.path.join(path, "cgroup.procs")).split()]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def kill(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def new_cgroup_fs() -> CgroupFS:
    return _HostCgroupFS()


class FakeCgroupFS:
    """In-memory folders (absolute paths). Knobs: ``busy`` (paths whose rmdir fails EBUSY, as a
    cgroup with processes), ``errors`` (path -> errno for rmdir), ``processes`` (path -> PIDs
    in it: the folder is busy until ``kill`` took the last). ``removed`` records rmdirs,
    ``killed`` kills."""

    def __init__(self, mountinfo: str, dirs: Iterable[str] = ()) -> None:
        self.text = mountinfo
        self.dirs: set[str] = set()
        self.busy: set[str] = set()
        self.errors: dict[str, int] = {}
        self.removed: list[str] = []
        self.files: dict[str, str] = {}  # path -> the last value written (or a seeded text)
        self.write_errors: dict[str, int] = {}  # path -> errno for write
        self.calls: list[tuple[str, str]] = []
        self.processes: dict[str, list[int]] = {}
        self.killed: list[int] = []
        self._lock = threading.Lock()
        for d in dirs:
            self.mkdir(d)

    def mkdir(self, path: str) -> None:
        """Create ``path`` and its parents (as runc's MkdirAll)."""
        with self._lock:
            parts = path.strip("/").split("/")
            for i in range(1, len(parts) + 1):
                self.dirs.add("/" + "/".join(parts[:i]))

    def write(self, path: str, value: str) -> None:
        with self._lock:
            self.calls.append(("write", f"{path}={value}"))
            if os.path.dirname(path) not in self.dirs:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
            if path in self.write_errors:
                code = self.write_errors[path]
                raise OSError(code, os.strerror(code), path)
            self.files[path] = value

    def read(self, path: str) -> str:
        with self._lock:
            if path not in self.files:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
            return self.files[path]

    def mountinfo(self) -> str:
        self.calls.append(("mountinfo", ""))
        return self.text

    def child_dirs(self, path: str) -> list[str]:
        with self._lock:
            self.calls.append(("child_dirs", path))
            prefix = path.rstrip("/") + "/"
            return sorted(d[len(prefix):] for d in self.dirs
                          if d.startswith(prefix) and "/" not in d[len(prefix):])

    def rmdir(self, path: str) -> None:
        with self._lock:
            self.calls.append(("rmdir", path))
            if path not in self.dirs:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
            if path in self.errors:
                code = self.errors[path]
                raise OSError(code, os.strerror(code), path)
            if path in self.busy or self.processes.get(path):
                raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), path)
            if any(d.startswith(path + "/") for d in self.dirs):
                raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), path)
            self.dirs.discard(path)
            self.removed.append(path)

    def procs(self, path: str) -> list[int]:
        with self._lock:
            return list(self.processes.get(path, []))

    def kill(self, pid: int) -> None:
        with self._lock:
            self.killed.append(pid)
            for pids in self.processes.values():
                if pid in pids:
                    pids.remove(pid)
