"""A pipe a helper thread writes to wake a process's poll loop."""

from __future__ import annotations

import contextlib
import fcntl
import os


class WakePipe:
    """``wake()`` from any thread; the loop polls ``read_fd`` and ``drain()``s it."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        for fd in (self.read_fd, self.write_fd):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # full: already awake; closed: stopping
            os.write(self.write_fd, b"x")

    def drain(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self.read_fd, 4096):
                pass

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)
