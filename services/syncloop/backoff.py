"""Per-container crash back-off (the kubelet's ``flowcontrol.Backoff``), on a monotonic clock.

Keyed by ``(pod uid, container name)``. The first restart after a crash is immediate; each
further restart waits ``initial * 2**(n-1)`` seconds after the container finished, capped at
``cap``. An entry whose last restart is older than ``reset_after`` seconds when the container
finishes again starts over. All times are monotonic seconds given by the caller.

Not thread-safe: the sync loop's worker threads share one instance behind ``SharedBackoff``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

BackoffKey = tuple[str, str]


@dataclass(frozen=True)
class BackoffPolicy:
    initial: float = 10.0
    cap: float = 300.0
    reset_after: float = 600.0

    def delay_for_restarts(self, restarts: int) -> float:
        """The delay an entry holds after ``restarts`` restarts (0 for the first)."""
        if restarts <= 0:
            return 0.0
        return float(min(self.cap, self.initial * 2 ** (restarts - 1)))


@dataclass(frozen=True)
class BackoffEntry:
    delay: float        # seconds to wait after the container finished before restarting it
    last_update: float  # monotonic time of the last restart


class CrashBackoff:
    """The back-off table. ``remaining`` is pure; ``record_restart`` changes the table."""

    def __init__(self, policy: BackoffPolicy) -> None:
        self.policy = policy
        self._entries: dict[BackoffKey, BackoffEntry] = {}

    def entry(self, key: BackoffKey) -> BackoffEntry | None:
        return self._entries.get(key)

    def _expired(self, entry: BackoffEntry, event_time: float) -> bool:
        return event_time - entry.last_update > self.policy.reset_after

    def seed(self, key: BackoffKey, restart_count: int, started_at: float) -> None:
        """Rebuild a lost entry (after a sync loop restart) from what the runtime shows: the
        container restarted ``restart_count`` times, the last time at ``started_at``."""
        if key in self._entries or restart_count <= 0:
            return
        delay = self.policy.delay_for_restarts(restart_count)
        self._entries[key] = BackoffEntry(delay, started_at)

    def remaining(self, key: BackoffKey, finished_at: float, now: float) -> float:
        """Seconds left before the container that finished at ``finished_at`` may restart."""
        entry = self._entries.get(key)
        if entry is None or self._expired(entry, finished_at):
            return 0.0
        return max(0.0, entry.delay - (now - finished_at))

    def record_restart(self, key: BackoffKey, finished_at: float, now: float) -> float:
        """A restart happens now; returns the delay the next restart will wait."""
        entry = self._entries.get(key)
        if entry is None or self._expired(entry, finished_at):
            delay = self.policy.initial
        else:
            delay = min(self.policy.cap, entry.delay * 2) if entry.delay else self.policy.initial
        delay = min(delay, self.policy.cap)
        self._entries[key] = BackoffEntry(delay, now)
        return delay

    def forget_key(self, key: BackoffKey) -> None:
        self._entries.pop(key, None)

    def forget_pod(self, uid: str) -> None:
        for key in [k for k in self._entries if k[0] == uid]:
            del self._entries[key]

    def gc(self, now: float) -> int:
        """Drop entries not touched for ``reset_after`` seconds; returns how many."""
        old = [k for k, e in self._entries.items() if now - e.last_update > self.policy.reset_after]
        for key in old:
            del self._entries[key]
        return len(old)


class SharedBackoff:
    """A ``CrashBackoff`` behind a lock, for the worker threads."""

    def __init__(self, inner: CrashBackoff) -> None:
        self._inner = inner
        self._lock = threading.Lock()

    @property
    def policy(self) -> BackoffPolicy:
        return self._inner.policy

    def seed(self, key: BackoffKey, restart_count: int, started_at: float) -> None:
        with self._lock:
            self._inner.seed(key, restart_count, started_at)

    def remaining(self, key: BackoffKey, finished_at: float, now: float) -> float:
        with self._lock:
            return self._inner.remaining(key, finished_at, now)

    def record_restart(self, key: BackoffKey, finished_at: float, now: float) -> float:
        with self._lock:
            return self._inner.record_restart(key, finished_at, now)

    def entry(self, key: BackoffKey) -> BackoffEntry | None:
        with self._lock:
            return self._inner.entry(key)

    def forget_key(self, key: BackoffKey) -> None:
        with self._lock:
            self._inner.forget_key(key)

    def forget_pod(self, uid: str) -> None:
        with self._lock:
            self._inner.forget_pod(uid)

    def gc(self, now: float) -> int:
        with self._lock:
            return self._inner.gc(now)
