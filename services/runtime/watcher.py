"""Learns of container exits: exit notes from monitors, and pidfds of monitors as the fallback.

A monitor, once its container's process has exited, its output is drained and ``exit.json`` is
written, sends one datagram (``monitor.exit_note``: container ID, exit code, finish time, reason,
exactly what ``exit.json`` holds) to the runtime's exit socket ``<root>/exits.sock``. The socket
is bound anew by every runtime start, so monitors of an earlier runtime reach the current one.
The pidfd of each monitor (monitors are not our children, so SIGCHLD cannot tell us) stays the
fallback: a note lost (no runtime listening, full queue, a path too long to bind) still ends in
``on_exit(key)`` when the monitor exits, and a runtime that was down reads ``exit.json`` at start.
One thread waits on one epoll set (the socket, every pidfd, a wake pipe for stop); adding a
pidfd does not wake it. Callbacks run on that thread and must be quick.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from podvisor.services.runtime.model import ExitInfo
from podvisor.services.runtime.procfs import is_alive

MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the terminating NUL


def bind_exit_socket(path: Path) -> socket.socket | None:
    """A datagram socket bound at ``path`` (a stale one of a predecessor replaced), mode 0600;
    None when the path is too long for a unix socket (the pidfd fallback then does the job)."""
    if len(os.fsencode(str(path))) > MAX_SOCKET_PATH:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    sock.setblocking(False)
    return sock


def parse_exit_note(data: bytes) -> tuple[str, ExitInfo] | None:
    try:
        note = json.loads(data)
        return str(note["id"]), ExitInfo(int(note["exit_code"]), int(note["finished_at"]),
                                         str(note["reason"]), str(note.get("message", "")))
    except (ValueError, KeyError, TypeError):
        return None


class ExitWatcher:
    def __init__(self, on_exit: Callable[[str], None],
                 on_note: Callable[[str, ExitInfo], None] | None = None) -> None:
        self._on_exit = on_exit
        self._on_note = on_note
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._by_fd: dict[int, str] = {}
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="exit-watcher", daemon=True)

    def listen(self, sock: socket.socket) -> None:
        """Also read exit notes from ``sock`` (call before ``start``)."""
        self._sock = sock
        self._epoll.register(sock.fileno(), select.EPOLLIN)

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
            if self._stopped:
                os.close(fd)
                return
            self._by_fd[fd] = key
            self._epoll.register(fd, select.EPOLLIN)  # epoll_wait sees it without a wake-up

    def stop(self) -> None:
        """Idempotent."""
        if self._epoll.closed:
            return
        self._stopped = True
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        with self._lock:
            for fd in self._by_fd:
                os.close(fd)
            self._by_fd.clear()
        self._epoll.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        if self._sock is not None:
            self._sock.close()

    def _loop(self) -> None:
        sock_fd = self._sock.fileno() if self._sock is not None else -1
        while not self._stopped:
            try:
                events = self._epoll.poll()
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
            for fd, _ev in events:
                if fd == sock_fd:
                    self._read_notes()
                elif fd != self._wake_r:
                    self._pidfd_ready(fd)

    def _read_notes(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            note = parse_exit_note(data)
            if note is not None and self._on_note is not None:
                self._on_note(*note)

    def _pidfd_ready(self, fd: int) -> None:
        with self._lock:
            key = self._by_fd.pop(fd, None)
            if key is None:
                return
            self._epoll.unregister(fd)
            os.close(fd)
        self._on_exit(key)
