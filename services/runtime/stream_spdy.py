"""remotecommand over SPDY/3.1 (``podvisor.common.spdy``), as the API server, kubectl and crictl
speak it: ``X-Stream-Protocol-Version`` v4/v3/v2 ``.channel.k8s.io``; the client opens one SPDY
stream per channel, named by its ``streamType`` header (error, stdin, stdout, stderr, resize),
within ``STREAM_CREATION_TIMEOUT``; v4's status is the ``metav1.Status`` JSON, v2/v3's the
error text. ``negotiate`` is the handshake port forward shares."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from podvisor.common.spdy import REFUSED_STREAM, Session, SpdyStream
from podvisor.common.upgrade import finish_hijacked, hijack
from podvisor.services.runtime.stream_base import (
    ERROR,
    RESIZE,
    STDERR,
    STDIN,
    STDOUT,
    AttachRequest,
    ExecRequest,
    Run,
    Streamed,
)

__all__ = ["SPDY_PROTOCOLS", "STREAM_CREATION_TIMEOUT", "accept_streams", "exec_spdy",
           "negotiate"]

SPDY_PROTOCOLS = ("v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io")
STREAM_CREATION_TIMEOUT = 30.0  # the kubelet's streamCreationTimeout
CHANNEL_NAMES = {STDIN: "stdin", STDOUT: "stdout", STDERR: "stderr", ERROR: "error",
                 RESIZE: "resize"}


async def exec_spdy(request: web.Request, req: ExecRequest | AttachRequest, run: Run,
                    log: Any) -> web.StreamResponse:
    """The kubelet's remotecommand server over SPDY/3.1: the client opens one stream per
    channel (``streamType`` header: error, stdin, stdout, stderr, resize) within
    ``STREAM_CREATION_TIMEOUT``; the status goes to the error stream."""
    proto, refusal = negotiate(request, SPDY_PROTOCOLS)
    if refusal is not None:
        return refusal
    reader, writer = await hijack(request, {
        "Connection": "Upgrade", "Upgrade": "SPDY/3.1",
        "X-Stream-Protocol-Version": proto})
    session = Session(reader, writer, server=True)
    runner = asyncio.ensure_future(session.run())
    expected = {"error"} | {name for name, on in (
        ("stdin", req.stdin), ("stdout", req.stdout), ("stderr", req.stderr),
        ("resize", req.tty and proto != "v2.channel.k8s.io")) if on}
    try:
        streams = await asyncio.wait_for(accept_streams(session, expected),
                                         STREAM_CREATION_TIMEOUT)
    except (TimeoutError, ConnectionError) as exc:
        log.warning("runtime.exec_streams_missing", container=req.container_id,
                          expected=sorted(expected), error=type(exc).__name__)
        await session.close(wait_for_peer=1.0)
        await runner
        return finish_hijacked()

    async def send(channel: int, data: bytes) -> None:
        stream = streams.get(CHANNEL_NAMES[channel])
        if stream is not None and not stream.local_closed:
            with contextlib.suppress(ConnectionError):
                await stream.write(data)

    async def feed(proc: Streamed) -> None:
        async def stdin() -> None:
            stream = streams.get("stdin")
            if stream is None:
                return
            while data := await stream.read():
                await proc.write_stdin(data)
            proc.close_stdin()

        async def resize() -> None:
            stream = streams.get("resize")
            decoder, buf = json.JSONDecoder(), ""
            while stream is not None and (data := await stream.read()):
                buf += data.decode(errors="replace")
                while buf.strip():
                    try:
                        obj, end = decoder.raw_decode(buf.lstrip())
                    except ValueError:
                        break
                    buf = buf.lstrip()[end:]
                    proc.resize(obj)

        async def gone() -> None:
            await session.went_away.wait()
            proc.kill()  # the client went away

        await asyncio.gather(stdin(), resize(), gone())

    status = await run(req, send, feed)
    for name in ("stdout", "stderr"):
        if name in streams:
            await streams[name].close()
    if not session.went_away.is_set():
        if proto == "v4.channel.k8s.io":
            message = json.dumps(status).encode()
        else:  # v2/v3: the error text; nothing on success
            message = (b"" if status["status"] == "Success"
                       else status["message"].encode())
        with contextlib.suppress(ConnectionError):
            if message:
                await streams["error"].write(message)
            await streams["error"].close()
    await session.close()
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await runner
    return finish_hijacked()


def negotiate(request: web.Request,
              supported: Sequence[str]) -> tuple[str, web.Response | None]:
    """``httpstream.Handshake``: the first of the client's ``X-Stream-Protocol-Version``
    values the server supports; 403 when there is none (as the kubelet answers)."""
    wanted = [p.strip() for v in request.headers.getall("X-Stream-Protocol-Version", [])
              for p in v.split(",") if p.strip()]
    for proto in wanted:
        if proto in supported:
            return proto, None
    return "", web.Response(status=403, text=(
        f"unable to upgrade: unable to negotiate protocol: client supports {wanted}, "
        f"server supports {list(supported)}\n"))


async def accept_streams(session: Session, expected: set[str]) -> dict[str, SpdyStream]:
    streams: dict[str, SpdyStream] = {}
    while set(streams) != expected:
        stream = await session.accept()
        if stream is None:
            raise ConnectionResetError("the client went away before opening its streams")
        kind = stream.header("streamType")
        if kind not in expected or kind in streams:
            await stream.reset(REFUSED_STREAM)
            continue
        streams[kind] = stream
    return streams
