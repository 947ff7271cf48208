"""The file source's loop state: when to read again, and what changed since the last read."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.services.sources.common import FirstSeen, SourceSet
from podvisor.services.sources.files import ParseCache, read_static_pods
from podvisor.services.sources.watcher import DirWatcher

Clock = Callable[[], float]
# After the first read, read (and publish) once more this soon: a subscriber that joined
# late, or a PUB socket whose subscriptions had not arrived yet, gets the set quickly.
EARLY_REPUBLISH = 1.0


class FileSource:
    """``poll(timeout)`` waits for an inotify change or the relist deadline and returns a fresh
    ``SourceSet`` when one is due (at start, on every change, every ``period``), else None.
    A read that fails as a whole raises ``SourceReadError`` and is retried at the next relist.
    One thread; the clock is monotonic, ``wall`` only stamps ``kubernetes.io/config.seen``."""

    def __init__(self, path: Path, node_name: str, period: float, watcher: DirWatcher, *,
                 clock: Clock = SYSTEM_CLOCK.monotonic, wall: Clock = SYSTEM_CLOCK.wall,
                 tick: Callable[[], None] = lambda: None) -> None:
        self.path = path
        self._node = node_name
        self._period = period
        self._watcher = watcher
        self._clock = clock
        self._tick = tick
        self._seen = FirstSeen(wall)
        self.cache = ParseCache()
        self._next: float | None = None
        self.reads = 0

    def poll(self, timeout: float) -> SourceSet | None:
        now = self._clock()
        changed = False
        if self._next is None:
            self._watcher.wait(0)  # watch first, then read: no change slips in between
        elif now < self._next:
            changed = self._watcher.wait(min(timeout, self._next - now))
            now = self._clock()
        if not changed and self._next is not None and now < self._next:
            return None
        delay = EARLY_REPUBLISH if self.reads == 0 else self._period
        self._next = now + min(delay, self._period)
        result = read_static_pods(self.path, self._node, self._seen, self._tick, self.cache)
        self.reads += 1
        self._seen.forget_except(p.uid for p in result.pods)
        return result

    def close(self) -> None:
        self._watcher.close()
