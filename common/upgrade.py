"""HTTP connection upgrades that aiohttp does not do itself (``Upgrade: SPDY/3.1``): take over
an aiohttp server connection after answering 101 (``hijack``), open an upgrade request to a
backend (``connect_upgrade``), and copy bytes both ways (``splice``), as the API server's and
the kubelet's upgrade-aware proxies do.

aiohttp's server only switches protocols for WebSocket; for any other upgrade the handler sends
the 101 itself and moves the transport to a plain ``asyncio.StreamReaderProtocol``
(``transport.set_protocol``): from then on aiohttp's request handler sees no more bytes. The
clients that upgrade (client-go, spdystream) wait for the 101 before sending anything, so no
upgraded bytes can be parsed as HTTP before the switch.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from aiohttp import web

__all__ = ["UpgradeError", "connect_upgrade", "hijack", "splice"]

HEAD_LIMIT = 64 * 1024


class UpgradeError(Exception):
    pass


async def hijack(request: web.Request,
                 headers: Sequence[tuple[str, str]] | Mapping[str, str],
                 status: int = 101, reason: str = "Switching Protocols",
                 ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Answer ``status`` with ``headers`` and take the connection over from aiohttp."""
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("the client went away")
    items = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
    head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in items)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=HEAD_LIMIT)
    protocol = asyncio.StreamReaderProtocol(reader)
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    writer.write((head + "\r\n").encode("latin-1"))
    await writer.drain()
    with contextlib.suppress(AttributeError, RuntimeError):
        transport.resume_reading()  # in case aiohttp had paused it
    return reader, writer


def finish_hijacked() -> web.StreamResponse:
    """What a handler returns after ``hijack``: nothing more is written; aiohttp closes."""
    response = web.Response(status=101)
    response.force_close()
    return response


async def connect_upgrade(url: str, method: str, path_and_query: str,
                          headers: Sequence[tuple[str, str]], *,
                          ssl_context: ssl.SSLContext | None = None,
                          ) -> tuple[int, str, list[tuple[str, str]], bytes,
                                     asyncio.StreamReader, asyncio.StreamWriter]:
    """Send an upgrade request to ``url``'s host and read the response head:
    (status, reason, headers, body-if-not-101, reader, writer)."""
    parts = urlsplit(url)
    secure = parts.scheme in ("https", "wss")
    port = parts.port or (443 if secure else 80)
    host = parts.hostname or "127.0.0.1"
    reader, writer = await asyncio.open_connection(
        host, port, ssl=(ssl_context or ssl.create_default_context()) if secure else None,
        limit=HEAD_LIMIT)
    lines = [f"{method} {path_and_query} HTTP/1.1", f"Host: {parts.netloc}",
             *(f"{k}: {v}" for k, v in headers), "Content-Length: 0", "", ""]
    writer.write("\r\n".join(lines).encode("latin-1"))
    await writer.drain()
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        writer.close()
        raise UpgradeError(f"no HTTP response from {host}:{port}: {exc}") from None
    status_line, *rest = head.decode("latin-1").split("\r\n")
    try:
        _, code, *why = status_line.split(" ", 2)
        status = int(code)
    except ValueError:
        writer.close()
        raise UpgradeError(f"bad HTTP status line from {host}:{port}: {status_line!r}") from None
    out = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in rest if line)]
    body = b""
    if status != 101:
        length = next((int(v) for k, v in out if k.lower() == "content-length"), None)
        with contextlib.suppress(asyncio.IncompleteReadError, asyncio.TimeoutError):
            body = await asyncio.wait_for(
                reader.readexactly(length) if length is not None else reader.read(HEAD_LIMIT),
                10.0)
        writer.close()
    return status, (why[0] if why else ""), out, body, reader, writer


async def splice(a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 b: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
    """Copy bytes both ways until both directions ended (each end's EOF is passed on as a
    half-close where the transport allows it); then close both."""
    async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(64 * 1024):
                dst.write(data)
                await dst.drain()
            if dst.can_write_eof():
                dst.write_eof()
            else:  # TLS: no half-close; the other direction's end closes all
                raise ConnectionResetError
        except (ConnectionError, OSError):
            raise ConnectionResetError from None

    tasks = [asyncio.ensure_future(pump(a[0], b[1])), asyncio.ensure_future(pump(b[0], a[1]))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await task
        for _, w in (a, b):
            w.close()
