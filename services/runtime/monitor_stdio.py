"""The Python monitor's side of a container's stdin and terminal (monitor.c's ``STDIO``
section, the same protocol): CRI's stdin / stdin_once / tty for ``kubectl run -it`` and
``kubectl attach -it``.

The container's stdin is a pipe, or with a terminal its stdin/stdout/stderr are a pty's slave
(the master's output is its stdout). Attach clients (the streaming server, stream_attach.py)
connect to the unix socket ``attach`` (mode 0600, one at a time) and send frames: a type byte,
a 2-byte big-endian length, the payload: ``d`` stdin data, ``c`` end of stdin, ``r`` "COLS
ROWS". With stdin_once stdin ends when the first client goes away. Ending stdin closes the
pipe; on a terminal it types ^D. Writes never block the monitor: data waits (and the client is
not read) until the container reads it. Only the standard library: the zygote forks this code.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import struct
import termios
from typing import Any

STDIN_BUFFER = 65536


class StdinFeed:
    def __init__(self, io: dict[str, Any]) -> None:
        self.once, self.tty, self.path = bool(io["stdin_once"]), bool(io["tty"]), io["attach"]
        self.listener: socket.socket | None = None
        self.client: socket.socket | None = None
        self.fd = -1  # the pipe's write end, or the pty master; -1: stdin ended
        self.child_fd = -1  # the pipe's read end (closed in the monitor after the fork)
        self.slave = ""
        self.ended = False
        self.pending = b""
        self.frames = b""

    def open(self) -> None:
        """Before the fork: the listening socket, the pipe or the terminal (OSError)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.path)
            os.chmod(self.path, 0o600)
            sock.listen(4)
        except OSError as err:
            sock.close()
            raise OSError(f"the container's attach socket {self.path}: {err.strerror} "
                          f"(errno {err.errno} {errno.errorcode.get(err.errno or 0, '')})"
                          ) from None
        sock.setblocking(False)
        self.listener = sock
        if self.tty:
            master, slave = os.openpty()
            self.slave = os.ttyname(slave)
            os.close(slave)
            os.set_blocking(master, False)
            self.fd = master
        else:
            r, w = os.pipe2(os.O_CLOEXEC)
            os.set_blocking(w, False)
            self.fd, self.child_fd = w, r

    def child_stdio(self, out_w: int, err_w: int) -> None:
        """In the container's child: its stdio (a session of its own first, whose controlling
        terminal is the pty's slave)."""
        if self.tty:
            os.setsid()
            slave = os.open(self.slave, os.O_RDWR)
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
            for fd in (0, 1, 2):
                os.dup2(slave, fd)
            if slave > 2:
                os.close(slave)
            return
        os.dup2(self.child_fd, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.setsid()

    def after_fork(self) -> None:
        if self.child_fd >= 0:
            os.close(self.child_fd)
            self.child_fd = -1

    # --- the monitor's loop (monitor.py _pump) -------------------------------------------
    def end(self) -> None:
        if self.client is not None:  # its writes fail now, rather than wait for a reader
            self.client.close()
            self.client = None
        if self.fd < 0:
            return
        if self.tty:
            with contextlib.suppress(OSError):
                os.write(self.fd, b"\x04")  # the master stays: it is the container's output
        else:
            os.close(self.fd)
        self.fd, self.pending = -1, b""

    def flush(self) -> None:
        while self.fd >= 0 and self.pending:
            try:
                n = os.write(self.fd, self.pending)
            except BlockingIOError:
                return
            except OSError:  # EPIPE: the container closed its stdin
                self.end()
                return
            self.pending = self.pending[n:]
        if self.ended and not self.pending:
            self.end()

    def accept(self) -> None:
        if self.listener is None:
            return
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        if self.client is not None:  # one client at a time
            conn.close()
            return
        conn.setblocking(False)
        self.client = conn

    def read_client(self) -> None:
        if self.client is None:
            return
        try:
            data = self.client.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.client.close()
            self.client, self.frames = None, b""
            self.ended = self.ended or self.once
            self.flush()
            return
        self.frames += data
        while len(self.frames) >= 3:
            kind, size = self.frames[:1], struct.unpack(">H", self.frames[1:3])[0]
            if len(self.frames) < 3 + size or len(self.pending) + size > STDIN_BUFFER:
                break
            payload, self.frames = self.frames[3:3 + size], self.frames[3 + size:]
            if kind == b"d" and self.fd >= 0 and not self.ended:
                self.pending += payload
            elif kind == b"c":
                self.ended = True
            elif kind == b"r" and self.tty and self.fd >= 0:
                self.resize(payload)
            self.flush()

    def resize(self, payload: bytes) -> None:
        try:
            cols, rows = (int(x) for x in payload.split())
        except ValueError:
            return
        if 0 < cols < 65536 and 0 < rows < 65536:
            with contextlib.suppress(OSError):
                fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def close(self) -> None:
        """The container is gone: no more attaches."""
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            with contextlib.suppress(OSError):
                os.unlink(self.path)
