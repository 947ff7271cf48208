"""Watches monitor processes through pidfds and calls back the moment one exits.

The monitors are not our children, so SIGCHLD cannot tell us; a pidfd works for any process.
One thread polls every pidfd plus a wake pipe; callbacks run on that thread and must be quick.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Callable

from podvisor.services.runtime.procfs import is_alive


class ExitWatcher:
    def __init__(self, on_exit: Callable[[str], None]) -> None:
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._by_fd: dict[int, str] = {}
        self._poller = select.poll()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._poller.register(self._wake_r, select.POLLIN)
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="exit-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def watch(self, key: str, pid: int, ticks: int) -> None:
        """Call ``on_exit(key)`` when (pid, ticks) exits; at once if it is already gone."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            self._on_exit(key)
            return
        if not is_alive(pid, ticks):  # exited (or the pid was reused) before we opened it
            os.close(fd)
            self._on_exit(key)
            return
        with self._lock:
            self._by_fd[fd] = key
            self._poller.register(fd, select.POLLIN)
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    def stop(self) -> None:
        self._stopped = True
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        with self._lock:
            for fd in self._by_fd:
                os.close(fd)
            self._by_fd.clear()

    def _loop(self) -> None:
        while not self._stopped:
            for fd, _ev in self._poller.poll():
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                    continue
                with self._lock:
                    key = self._by_fd.pop(fd, None)
                    if key is None:
                        continue
                    self._poller.unregister(fd)
                    os.close(fd)
                self._on_exit(key)
