"""A process's view of the injected faults aimed at it (issue 28).

The supervisor writes the faults in force to ``run/faults/faults.json`` (``ipc/faults.py``,
replaced atomically); ``FaultWatch`` reads it at start and again whenever the directory says a
file was renamed into it (inotify ``IN_MOVED_TO``: only that file is ever renamed there), and
keeps the faults whose ``target`` is this process. The service loop watches ``fd`` and hands the
faults to its seams (``ServiceLoop.on_faults``): the bus gate, the embedded runtime's servicer.
A process restarted while a fault is in force reads it at start, so it gets the fault again
until it is cleared or expires. Without inotify (or the directory) the watch reads the file
once and never changes: a process never fails for want of a fault.
"""

from __future__ import annotations

import contextlib
import os

import inotify_simple

from podvisor.ipc.faults import ActiveFault, read_faults
from podvisor.ipc.paths import RunPaths

__all__ = ["FaultWatch"]


class FaultWatch:
    """One thread (the loop's)."""

    def __init__(self, paths: RunPaths, name: str) -> None:
        self.name = name
        self._file = paths.faults_file
        self._inotify: inotify_simple.INotify | None = None
        with contextlib.suppress(OSError):
            paths.faults_dir.mkdir(exist_ok=True)  # under run/, which the supervisor made
            inotify = inotify_simple.INotify()
            try:
                inotify.add_watch(str(paths.faults_dir), inotify_simple.flags.MOVED_TO)
            except OSError:
                inotify.close()
                raise
            os.set_blocking(inotify.fileno(), False)
            self._inotify = inotify
        self.current: tuple[ActiveFault, ...] = self._read()

    @property
    def fd(self) -> int | None:
        return None if self._inotify is None else self._inotify.fileno()

    def _read(self) -> tuple[ActiveFault, ...]:
        return tuple(f for f in read_faults(self._file) if f.spec.aimed_at(self.name))

    def changed(self) -> bool:
        """Drain the watch; True when the faults aimed at this process changed."""
        if self._inotify is not None:
            with contextlib.suppress(BlockingIOError, OSError):
                self._inotify.read(timeout=0)
        faults = self._read()
        if faults == self.current:
            return False
        self.current = faults
        return True

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
