"""Attach (CRI ``Attach``) on the streaming server: the container's output as its CRI log file
has it, from now until the container exits; the client's input stops it (``Follower``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from podvisor.services.runtime.stream_base import (
    CHUNK,
    STDERR,
    STDOUT,
    AttachRequest,
    Feed,
    Send,
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
    """``<time> <stdout|stderr> <P|F> <content>`` -> (channel, bytes); a full line (F) gets
    its newline back, a partial one (P) does not."""
    parts = line.split(b" ", 3)
    if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr"):
        return None
    content = parts[3] if len(parts) == 4 else b""
    return (STDOUT if parts[1] == b"stdout" else STDERR,
            content + (b"" if parts[2] == b"P" else b"\n"))


class Follower:
    """An attach's input side: no stdin, no terminal; ``kill`` (the client went away) stops
    following."""

    def __init__(self) -> None:
        self.stopped = asyncio.Event()

    async def write_stdin(self, data: bytes) -> None:
        return None

    def close_stdin(self) -> None:
        return None

    def resize(self, size: Any) -> None:
        return None

    def resize_json(self, data: bytes) -> None:
        return None

    def kill(self) -> None:
        self.stopped.set()


async def follow(req: AttachRequest, send: Send, feed: Feed, log: Any) -> dict[str, Any]:
    """Attach: the container's CRI log from its current end on, each line to its stream's
    channel, until the container is no longer running (then what is left is sent) or the
    client goes away. The file is read every ``ATTACH_POLL`` seconds (and reopened from
    its start when it was rotated)."""
    follower = Follower()
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
    log.info("runtime.attach_finished", container=req.container_id)
    return {"metadata": {}, "status": "Success"}
