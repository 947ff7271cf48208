"""Port forward (CRI ``PortForward``) on the streaming server, in both of the kubelet's protocols:
SPDY/3.1 ``portforward.k8s.io`` (a data and an error stream per forwarded connection) and
WebSocket (two channels per port). The port is the sandbox's localhost (``connect_port``)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from typing import Any

from aiohttp import WSMsgType, web

from podvisor.common.spdy import REFUSED_STREAM, Session, SpdyStream
from podvisor.common.upgrade import finish_hijacked, hijack
from podvisor.services.runtime import netns as netns_mod
from podvisor.services.runtime.stream_base import CHUNK, PortForwardRequest
from podvisor.services.runtime.stream_spdy import negotiate
from podvisor.services.runtime.stream_ws import send_ws

__all__ = ["PORT_FORWARD_PROTOCOLS", "WS_PORT_FORWARD_PROTOCOLS", "connect_port",
           "port_forward_spdy", "port_forward_ws"]

PORT_FORWARD_PROTOCOLS = ("portforward.k8s.io",)
WS_PORT_FORWARD_PROTOCOLS = ("v4.channel.k8s.io", "portforward.k8s.io")


async def connect_port(port: int, netns: str = ""
                       ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The port on the sandbox's localhost: in its network namespace when it has one
    (``networkPlugin: cni``; the socket is made on a thread of its own that enters the
    namespace, as containerd's port forward does), else the host's."""
    if netns:
        sock = await asyncio.get_running_loop().run_in_executor(None, _connect_in, netns, port)
        return await asyncio.open_connection(sock=sock)
    try:
        return await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return await asyncio.open_connection("::1", port)


def _connect_in(netns: str, port: int) -> socket.socket:
    """A TCP connection to localhost:``port`` inside ``netns`` (blocking; 5 s at most).
    Run in a fresh thread: network namespaces are per thread, and this one leaves."""
    out: list[socket.socket | BaseException] = []

    def run() -> None:
        try:
            back = netns_mod.enter(netns)
        except OSError as err:
            out.append(err)
            return
        try:
            out.append(_dial(port))
        except OSError as err:
            out.append(err)
        finally:
            back()
    t = threading.Thread(target=run, name="portforward-netns", daemon=True)
    t.start()
    t.join()
    if not out:
        raise OSError(f"no connection made in {netns}")
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def _dial(port: int) -> socket.socket:
    errors: list[OSError] = []
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(5.0)
        try:
            sock.connect((host, port))
        except OSError as err:
            sock.close()
            errors.append(err)
            continue
        sock.setblocking(False)
        return sock
    raise errors[0]


async def port_forward_spdy(request: web.Request, req: PortForwardRequest,
                            log: Any) -> web.StreamResponse:
    """The kubelet's SPDY port forward: the client opens a pair of streams (``streamType``
    data and error, same ``requestID``, the ``port`` header) per connection it forwards,
    for the session's life."""
    proto, refusal = negotiate(request, PORT_FORWARD_PROTOCOLS)
    if refusal is not None:
        return refusal
    reader, writer = await hijack(request, {
        "Connection": "Upgrade", "Upgrade": "SPDY/3.1",
        "X-Stream-Protocol-Version": proto})
    session = Session(reader, writer, server=True)
    runner = asyncio.ensure_future(session.run())
    pairs: dict[str, dict[str, SpdyStream]] = {}
    tasks: set[asyncio.Future[None]] = set()
    log.info("runtime.port_forward_started", sandbox=req.sandbox_id)
    try:
        while (stream := await session.accept()) is not None:
            kind, rid = stream.header("streamType"), stream.header("requestID")
            pair = pairs.setdefault(rid, {})
            if kind not in ("data", "error") or not rid or kind in pair:
                await stream.reset(REFUSED_STREAM)
                continue
            pair[kind] = stream
            if len(pair) == 2:
                del pairs[rid]
                task = asyncio.ensure_future(_forward_spdy(
                    req, pair["data"].header("port"), pair["data"], pair["error"], log))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
    finally:
        for pending in list(tasks):
            pending.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await session.close(wait_for_peer=1.0)
        await runner
    log.info("runtime.port_forward_finished", sandbox=req.sandbox_id)
    return finish_hijacked()

async def _forward_spdy(req: PortForwardRequest, port_text: str, data: SpdyStream,
                       error: SpdyStream, log: Any) -> None:
    try:
        port = int(port_text)
        if not 0 < port < 65536:
            raise ValueError(port_text)
        target = await connect_port(port, req.netns)
    except (ValueError, OSError) as exc:
        message = (f"invalid port {port_text!r}" if isinstance(exc, ValueError) else
                   f"failed to connect to localhost:{port_text} in pod sandbox "
                   f"{req.sandbox_id}: {exc}")
        log.warning("runtime.port_forward_failed", sandbox=req.sandbox_id, error=message)
        with contextlib.suppress(ConnectionError):
            await error.write(message.encode())
        await error.close()
        await data.close()
        return
    t_reader, t_writer = target

    async def up() -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await data.read():
                t_writer.write(chunk)
                await t_writer.drain()
            if t_writer.can_write_eof():
                t_writer.write_eof()

    async def down() -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await t_reader.read(CHUNK):
                await data.write(chunk)
        await data.close()

    # the client's end of input half-closes the connection; the server's end ends the pair
    upward = asyncio.ensure_future(up())
    try:
        await down()
    finally:
        upward.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await upward
        t_writer.close()
        await error.close()

async def port_forward_ws(request: web.Request, req: PortForwardRequest) -> web.StreamResponse:
    """The kubelet's WebSocket port forward: ``port`` query values (else the CRI
    request's); channel 2i carries port i's data, 2i+1 its errors; the server's first
    message on every channel is the port (2 bytes, little endian). One connection per
    port; the WebSocket ends when they all have."""
    try:
        ports = [int(p) for p in request.query.getall("port", [])] or list(req.ports)
    except ValueError:
        return web.Response(status=400, text="port forward: invalid port\n")
    if not ports or not all(0 < p < 65536 for p in ports):
        return web.Response(status=400, text="port forward: a port (1-65535) is needed "
                                             "(the port query parameter)\n")
    ws = web.WebSocketResponse(protocols=WS_PORT_FORWARD_PROTOCOLS, max_msg_size=0)
    if not ws.can_prepare(request).ok:
        return web.Response(status=400, text="port forward needs an upgrade: SPDY/3.1 "
                            "with portforward.k8s.io, or WebSocket\n")
    await ws.prepare(request)
    writers: dict[int, asyncio.StreamWriter] = {}

    async def forward(i: int, port: int) -> None:
        try:  # connected before the port is announced: the client may send right after
            t_reader, t_writer = await connect_port(port, req.netns)
        except OSError as exc:
            for channel in (2 * i, 2 * i + 1):
                await send_ws(ws, channel, port.to_bytes(2, "little"))
            await send_ws(ws, 2 * i + 1, f"failed to connect to localhost:{port} in pod "
                                         f"sandbox {req.sandbox_id}: {exc}".encode())
            return
        writers[i] = t_writer
        for channel in (2 * i, 2 * i + 1):
            await send_ws(ws, channel, port.to_bytes(2, "little"))
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await t_reader.read(CHUNK):
                await send_ws(ws, 2 * i, chunk)
        t_writer.close()

    async def feed() -> None:
        async for msg in ws:
            if msg.type is not WSMsgType.BINARY or len(msg.data) < 2:
                continue
            channel, payload = msg.data[0], msg.data[1:]
            writer = writers.get(channel // 2)
            if channel % 2 == 0 and writer is not None and not writer.is_closing():
                writer.write(payload)
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
        for writer in writers.values():
            writer.close()

    feeder = asyncio.ensure_future(feed())
    try:
        await asyncio.gather(*(forward(i, p) for i, p in enumerate(ports)))
    finally:
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeder
        await ws.close()
    return ws
