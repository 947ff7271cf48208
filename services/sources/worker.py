"""Keeping a source process's main thread free to heartbeat while slow work runs elsewhere.

Parsing a 10 MiB YAML file or waiting on a slow server takes seconds; the supervisor kills a
process that stops heartbeating. So the work runs on a helper thread and the main thread
heartbeats, publishes (zmq sockets stay on the main thread) and watches the helper: work that
makes no progress for ``STALL_LIMIT`` seconds is a hang, raised as ``WorkerStalled`` so the
supervisor restarts the process (a hung subsystem counts as a dead one).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from podvisor.ipc.clock import SYSTEM_CLOCK

T = TypeVar("T")
STALL_LIMIT = 120.0
Clock = Callable[[], float]


class WorkerStalled(RuntimeError):
    """The helper thread made no progress for too long."""


class Progress:
    """A timestamp the worker refreshes (``tick``) and the main thread reads. Thread-safe (one
    float assignment)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK.monotonic) -> None:
        self._clock = clock
        self._last = clock()

    def tick(self) -> None:
        self._last = self._clock()

    def stalled_for(self) -> float:
        return self._clock() - self._last


class LoopWorker(Generic[T]):
    """Runs ``step()`` over and over on a daemon thread until ``stop`` is set; each non-None
    result is queued for ``next(timeout)`` on the main thread. An exception in ``step`` ends
    the worker and is re-raised by ``next``; so is ``WorkerStalled`` after ``limit`` seconds
    without a tick (``step`` may call ``progress.tick`` itself while it works)."""

    def __init__(self, step: Callable[[], T | None], stop: threading.Event,
                 progress: Progress, limit: float = STALL_LIMIT, name: str = "worker") -> None:
        self._step = step
        self._stop = stop
        self.progress = progress
        self._limit = limit
        self._queue: queue.Queue[T | BaseException] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        # readable while results are queued: the main thread polls it beside its sockets
        self._rfd, self._wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    @property
    def wake_fd(self) -> int:
        return self._rfd

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.progress.tick()
                result = self._step()
                if result is not None:
                    self._put(result)
        except BaseException as exc:
            self._put(exc)

    def _put(self, item: T | BaseException) -> None:
        self._queue.put(item)
        with contextlib.suppress(OSError):  # full: the main thread has a wake-up pending
            os.write(self._wfd, b"x")

    def take(self) -> list[T]:
        """Every queued result without waiting (clears ``wake_fd``). Raises the worker's
        failure, or ``WorkerStalled``."""
        with contextlib.suppress(OSError):
            while os.read(self._rfd, 4096):
                pass
        out: list[T] = []
        while (item := self.next(0.0)) is not None:
            out.append(item)
        return out

    def next(self, timeout: float) -> T | None:
        """The next result, or None after ``timeout``. Raises the worker's failure."""
        if self.progress.stalled_for() > self._limit:
            raise WorkerStalled(f"no progress for {self.progress.stalled_for():.0f} s")
        try:
            item = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def join(self, timeout: float) -> None:
        """Wait for the thread (it ends after its current step once ``stop`` is set); the wake
        pipe is closed once it has ended (a daemon thread still blocked keeps it)."""
        self._thread.join(timeout)
        if not self._thread.is_alive():
            for fd in (self._rfd, self._wfd):
                with contextlib.suppress(OSError):
                    os.close(fd)


def run_in_thread(fn: Callable[[], T], heartbeat: Callable[[], None], stop: threading.Event,
                  poll: float, limit: float = STALL_LIMIT) -> tuple[bool, T | None]:
    """Run ``fn`` once on a daemon thread, calling ``heartbeat`` every ``poll`` seconds.
    (False, None) if ``stop`` is set first; re-raises ``fn``'s exception; ``WorkerStalled``
    if it runs longer than ``limit`` seconds."""
    box: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            box.append(fn())
        except BaseException as exc:
            error.append(exc)

    started = SYSTEM_CLOCK.monotonic()
    thread = threading.Thread(target=target, name="source-once", daemon=True)
    thread.start()
    while thread.is_alive():
        heartbeat()
        thread.join(poll)
        if stop.is_set() and thread.is_alive():
            return False, None
        if SYSTEM_CLOCK.monotonic() - started > limit and thread.is_alive():
            raise WorkerStalled(f"still running after {limit:.0f} s")
    if error:
        raise error[0]
    return True, box[0]
