"""Attach (CRI ``Attach``) on the streaming server: the container's output as its CRI log file
has it, from now until the container exits; with stdin, the client's input goes to the
container's stdin or terminal through its monitor's attach socket (monitor.c ``STDIO``: frames
of a type byte, a 2-byte big-endian length and the payload: ``d`` data, ``c`` end of stdin,
``r`` "COLS ROWS"). The client going away ends the attach (``Follower``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
from typing import Any

from podvisor.common import crilog
from podvisor.services.runtime.stream_base import (
    CHUNK,
    STDERR,
    STDOUT,
    AttachRequest,
    Feed,
    Send,
    failure_status,
)

__all__ = ["ATTACH_POLL", "Follower", "follow", "parse_cri_line"]

ATTACH_POLL = 0.2


def _log_end(path: str) -> tuple[int, tuple[int, int]]:
    try:
        st = os.stat(path)
    except OSError:
        return 0, (0, 0)
    return st.st_size, (st.st_dev, st.st_ino)


def parse_cri_line(line: bytes) -> tuple[int, bytes] | None:
    """A CRI log entry -> (channel, bytes); a full entry gets its newline back, a partial one
    does not."""
    parsed = crilog.parse_line(line)
    if parsed is None:
        return None
    stream, text, full = parsed
    return STDOUT if stream == "stdout" else STDERR, text + (b"\n" if full else b"")


class Follower:
    """An attach's input side: the container's stdin through ``writer`` (its monitor's attach
    socket; None: no stdin); ``kill`` (the client went away) stops following."""

    def __init__(self, writer: asyncio.StreamWriter | None = None) -> None:
        self.stopped = asyncio.Event()
        self.writer = writer

    def _frame(self, kind: bytes, payload: bytes = b"") -> None:
        if self.writer is None or self.writer.is_closing():
            return
        for i in range(0, max(len(payload), 1), 65535):
            chunk = payload[i:i + 65535]
            self.writer.write(kind + struct.pack(">H", len(chunk)) + chunk)

    async def write_stdin(self, data: bytes) -> None:
        self._frame(b"d", data)
        if self.writer is not None:
            with contextlib.suppress(ConnectionError):
                await self.writer.drain()

    def close_stdin(self) -> None:
        self._frame(b"c")

    def resize(self, size: Any) -> None:
        """``{"Width": columns, "Height": rows}`` (remotecommand's TerminalSize)."""
        if isinstance(size, dict):
            with contextlib.suppress(TypeError, ValueError):
                self._frame(b"r", b"%d %d" % (int(size.get("Width", 0)),
                                              int(size.get("Height", 0))))

    def resize_json(self, data: bytes) -> None:
        with contextlib.suppress(ValueError):
            self.resize(json.loads(data))

    def kill(self) -> None:
        self.stopped.set()
        if self.writer is not None:
            self.writer.close()


async def follow(req: AttachRequest, send: Send, feed: Feed, log: Any) -> dict[str, Any]:
    """Attach: the container's CRI log from its current end on, each line to its stream's
    channel, until the container is no longer running (then what is left is sent) or the
    client goes away. The file is read every ``ATTACH_POLL`` seconds (and reopened from
    its start when it was rotated)."""
    writer = None
    if req.stdin and req.socket:
        try:
            _reader, writer = await asyncio.open_unix_connection(req.socket)
        except OSError as err:
            return failure_status(f"attach: the container's stdin ({req.socket}): "
                                  f"{err.strerror or err}")
    follower = Follower(writer)
    feeder = asyncio.ensure_future(feed(follower))
    log.info("runtime.attach_started", container=req.container_id)
    path = req.log_path
    try:
        offset, ident = _log_end(path)
        pending = b""
        while not follower.stopped.is_set():
            alive = req.running()
            try:
                st = os.stat(path)
                if (st.st_dev, st.st_ino) != ident or st.st_size < offset:
                    offset, ident, pending = 0, (st.st_dev, st.st_ino), b""
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read(CHUNK * 8)
            except OSError:
                data = b""
            offset += len(data)
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                parsed = parse_cri_line(line)
                if parsed is None:
                    continue
                stream, content = parsed
                if (stream == STDOUT and req.stdout) or (stream == STDERR and req.stderr):
                    await send(stream, content)
            if not data and not alive:
                break
            if not data:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(follower.stopped.wait(), ATTACH_POLL)
    finally:
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeder
        if writer is not None:
            writer.close()
    log.info("runtime.attach_finished", container=req.container_id)
    return {"metadata": {}, "status": "Success"}
