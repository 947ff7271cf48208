"""remotecommand over WebSocket (``v5.channel.k8s.io`` or ``v4.channel.k8s.io``): every binary
message starts with its channel byte (0 stdin, 1 stdout, 2 stderr, 3 error: the final
``metav1.Status`` as JSON, with the exit code, 4 resize); v5 adds ``255 <channel>`` to close a
channel (stdin: the command sees end of file)."""

from __future__ import annotations

import contextlib
import json

from aiohttp import WSMsgType, web

from podvisor.services.runtime.stream_base import (
    CLOSE,
    ERROR,
    RESIZE,
    STDIN,
    AttachRequest,
    ExecRequest,
    Run,
    Streamed,
)
from podvisor.services.runtime.stream_spdy import SPDY_PROTOCOLS

__all__ = ["PROTOCOLS", "exec_ws", "send_ws"]

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")


async def exec_ws(request: web.Request, req: ExecRequest | AttachRequest,
                  run: Run) -> web.StreamResponse:
    """Exec (or attach) over a WebSocket; 400 when the request is no WebSocket upgrade."""
    ws = web.WebSocketResponse(protocols=PROTOCOLS, max_msg_size=0)
    if not ws.can_prepare(request).ok:
        return web.Response(status=400, text="exec needs an upgrade: WebSocket with one "
                            f"of the protocols {', '.join(PROTOCOLS)}, or SPDY/3.1 with "
                            f"{', '.join(SPDY_PROTOCOLS)}\n")
    await ws.prepare(request)
    v5 = ws.ws_protocol == PROTOCOLS[0]

    async def send(channel: int, data: bytes) -> None:
        await send_ws(ws, channel, data)

    async def feed(proc: Streamed) -> None:
        async for msg in ws:
            if msg.type is not WSMsgType.BINARY or not msg.data:
                continue
            data: bytes = msg.data
            channel = data[0]
            if channel == STDIN and len(data) > 1:
                await proc.write_stdin(data[1:])
            elif channel == RESIZE:
                proc.resize_json(data[1:])
            elif v5 and channel == CLOSE and data[1:2] == bytes([STDIN]):
                proc.close_stdin()
        proc.kill()  # the client went away: nobody reads the command's output any more

    status = await run(req, send, feed)
    if not ws.closed:
        await send_ws(ws, ERROR, json.dumps(status).encode())
        await ws.close()
    return ws


async def send_ws(ws: web.WebSocketResponse, channel: int, data: bytes) -> None:
    with contextlib.suppress(ConnectionError):
        await ws.send_bytes(bytes([channel]) + data)
