"""The exec'd command of the streaming server: pipes, or one pty as the command's terminal
(``Proc``)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import shutil
import signal
import struct
import termios
from typing import Any

from podvisor.services.runtime.stream_base import CHUNK, STDOUT, Send

__all__ = ["Proc"]


class Proc:
    """The exec'd command: pipes, or one pty (``tty``: stdin, stdout and stderr are the
    terminal, which becomes the command's controlling terminal through util-linux
    ``setsid --ctty``; ``resize`` sets its window size, the kernel sends SIGWINCH)."""

    def __init__(self, proc: asyncio.subprocess.Process, master: int | None) -> None:
        self._proc, self._master = proc, master
        self._stdin_open = master is not None or proc.stdin is not None

    @classmethod
    async def spawn(cls, argv: list[str], env: dict[str, str], cwd: str, *, stdin: bool,
                    stdout: bool, stderr: bool, tty: bool) -> Proc:
        if not tty:
            pipe, null = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
            proc = await asyncio.create_subprocess_exec(
                *argv, env=env, cwd=cwd, start_new_session=True,
                stdin=pipe if stdin else null, stdout=pipe if stdout else null,
                stderr=pipe if stderr else null)
            return cls(proc, None)
        setsid = shutil.which("setsid")
        if setsid is None:
            raise OSError("exec with a tty needs setsid (util-linux) on the runtime's PATH")
        master, slave = pty.openpty()
        try:
            # not a group leader when spawned: setsid(1) then makes it one, in its own session
            # with the pty as controlling terminal, without forking (same PID)
            proc = await asyncio.create_subprocess_exec(
                setsid, "--ctty", *argv, env=env, cwd=cwd, stdin=slave, stdout=slave,
                stderr=slave)
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        return cls(proc, master)

    async def copy_out(self, channel: int, send: Send) -> None:
        if self._master is not None:
            if channel == STDOUT:
                while chunk := await self._read_master():
                    await send(STDOUT, chunk)
            return
        stream = self._proc.stdout if channel == STDOUT else self._proc.stderr
        while stream is not None and (chunk := await stream.read(CHUNK)):
            await send(channel, chunk)

    async def _read_master(self) -> bytes:
        assert self._master is not None
        loop, fd = asyncio.get_running_loop(), self._master
        while True:
            try:
                return os.read(fd, CHUNK)
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_reader(fd, ready.set_result, None)
                try:
                    await ready
                finally:
                    loop.remove_reader(fd)
            except OSError:  # EIO: every holder of the terminal's other side closed it
                return b""

    async def write_stdin(self, data: bytes) -> None:
        if not self._stdin_open:
            return
        if self._master is None:
            stdin = self._proc.stdin
            if stdin is not None:
                stdin.write(data)
                with contextlib.suppress(ConnectionError):
                    await stdin.drain()
            return
        loop, fd, view = asyncio.get_running_loop(), self._master, memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_writer(fd, ready.set_result, None)
                try:
                    await ready
                finally:
                    loop.remove_writer(fd)
            except OSError:
                return

    def close_stdin(self) -> None:
        """End of the client's stdin: the pipe closes; on a terminal, an end-of-file
        character (^D) is typed, as a user would."""
        if not self._stdin_open:
            return
        self._stdin_open = False
        if self._master is not None:
            with contextlib.suppress(OSError):
                os.write(self._master, b"\x04")
        elif self._proc.stdin is not None:
            self._proc.stdin.close()

    def resize_json(self, data: bytes) -> None:
        with contextlib.suppress(ValueError):
            self.resize(json.loads(data))

    def resize(self, size: Any) -> None:
        """``{"Width": columns, "Height": rows}`` (remotecommand's TerminalSize)."""
        if self._master is None or not isinstance(size, dict):
            return
        try:
            cols, rows = int(size.get("Width", 0)), int(size.get("Height", 0))
        except (TypeError, ValueError):
            return
        if 0 < cols < 65536 and 0 < rows < 65536:
            with contextlib.suppress(OSError):
                fcntl.ioctl(self._master, termios.TIOCSWINSZ,
                            struct.pack("HHHH", rows, cols, 0, 0))

    async def wait(self) -> int:
        code = await self._proc.wait()
        return 128 - code if code < 0 else code

    def kill(self) -> None:
        if self._proc.returncode is None:
            with contextlib.suppress(OSError):
                os.killpg(self._proc.pid, signal.SIGKILL)

    async def reap(self) -> None:
        self.kill()
        await self._proc.wait()
        if self._master is not None:
            os.close(self._master)
            self._master = None
