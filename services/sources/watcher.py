"""Watching the static pod path for changes (inotify), behind a small interface.

The watch follows the path: a directory is watched itself; a single file, or a path that does
not exist yet, is watched through its parent directory (filtered on the name), so creating the
directory later is noticed and the watch moves onto it. Events for names starting with '.'
are ignored; a burst of events is coalesced into one "changed".

Thread-safety: one thread. Blind spot: changes inside subdirectories are not watched (the
source does not recurse), and a parent that does not exist either is only noticed by relists.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Protocol

from inotify_simple import INotify, flags

from podvisor.ipc.clock import SYSTEM_CLOCK

_MASK = (flags.CREATE | flags.DELETE | flags.MODIFY | flags.CLOSE_WRITE | flags.MOVED_FROM
         | flags.MOVED_TO | flags.ATTRIB | flags.DELETE_SELF | flags.MOVE_SELF)
_GONE = flags.IGNORED | flags.DELETE_SELF | flags.MOVE_SELF | flags.UNMOUNT


class DirWatcher(Protocol):
    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True if the watched path (may have) changed."""
        ...

    def close(self) -> None:
        ...


def new_inotify_watcher(path: Path, coalesce: float = 0.005,
                        max_burst: float = 0.5) -> DirWatcher:
    """An inotify watcher of ``path``. Events closer than ``coalesce`` seconds are merged,
    for at most ``max_burst`` seconds."""
    return _InotifyWatcher(path, coalesce, max_burst)


class _InotifyWatcher:
    def __init__(self, path: Path, coalesce: float, max_burst: float) -> None:
        self._path = path
        self._coalesce_ms = max(1, int(coalesce * 1000))
        self._max_burst = max_burst
        self._inotify = INotify()
        self._wd: int | None = None
        self._target: Path | None = None
        self._name_filter: str | None = None

    def wait(self, timeout: float) -> bool:
        changed = self._retarget()
        events = self._inotify.read(timeout=max(0, int(timeout * 1000)))
        relevant = self._relevant(events)
        if not relevant:
            return changed
        deadline = SYSTEM_CLOCK.monotonic() + self._max_burst
        while SYSTEM_CLOCK.monotonic() < deadline:
            more = self._inotify.read(timeout=self._coalesce_ms)
            if not more:
                break
            self._relevant(more)
        self._retarget()
        return True

    def close(self) -> None:
        self._inotify.close()

    def _desired(self) -> tuple[Path | None, str | None]:
        if self._path.is_dir():
            return self._path, None
        if self._path.parent.is_dir():
            return self._path.parent, self._path.name
        return None, None

    def _retarget(self) -> bool:
        """Point the watch where it should be now; True if it moved (a change may be unseen)."""
        target, name = self._desired()
        if target == self._target and name == self._name_filter and self._wd is not None:
            return False
        if self._wd is not None:
            with contextlib.suppress(OSError):
                self._inotify.rm_watch(self._wd)
        self._wd, self._target, self._name_filter = None, target, name
        if target is not None:
            try:
                self._wd = self._inotify.add_watch(os.fspath(target), _MASK)
            except OSError:
                self._target = None
        return True

    def _relevant(self, events: list[Any]) -> bool:
        relevant = False
        for event in events:
            wd, mask, name = event.wd, event.mask, event.name
            if mask & flags.Q_OVERFLOW:
                relevant = True
                continue
            if wd != self._wd:
                continue
            if mask & _GONE:
                self._wd = None
                relevant = True
            elif self._name_filter is not None:
                relevant |= name == self._name_filter
            elif not name.startswith(".") and not (mask & flags.ISDIR):
                relevant = True
        return relevant
