"""A SPDY remotecommand client for the tests (client-go's ``remotecommand`` v4 as a Python
client over ``podvisor.common.spdy``): exec/attach with stdin, stdout, stderr, error and resize
streams, and port-forward's data/error stream pairs."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from podvisor.common import spdy
from podvisor.common.upgrade import connect_upgrade


@dataclass
class Result:
    status_code: int
    protocol: str = ""
    stdout: bytes = b""
    stderr: bytes = b""
    error: bytes = b""
    body: bytes = b""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> dict[str, Any]:
        return json.loads(self.error) if self.error else {}


async def _upgrade(url: str, protocols: list[str], headers: dict[str, str] | None,
                   ctx: ssl.SSLContext | None, method: str = "POST",
                   ) -> tuple[Result, spdy.Session | None, asyncio.Task[None] | None]:
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    hdrs = [("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"),
            *(("X-Stream-Protocol-Version", p) for p in protocols),
            *((headers or {}).items())]
    code, _, got, body, reader, writer = await connect_upgrade(url, method, path, hdrs,
                                                               ssl_context=ctx)
    if code != 101:
        return Result(code, body=body), None, None
    chosen = next((v for k, v in got if k.lower() == "x-stream-protocol-version"), "")
    session = spdy.Session(reader, writer, server=False)
    return Result(101, chosen), session, asyncio.ensure_future(session.run())


async def spdy_exec(url: str, *, stdin: bytes | None = None, stdout: bool = True,
                    stderr: bool = True, tty: bool = False,
                    resize: tuple[int, int] | None = None, close_stdin: bool = True,
                    stdin_after: bytes = b"",
                    on_stdout: Callable[[bytes], None] | None = None,
                    protocols: tuple[str, ...] = ("v4.channel.k8s.io",),
                    headers: dict[str, str] | None = None,
                    ctx: ssl.SSLContext | None = None) -> Result:
    result, session, runner = await _upgrade(url, list(protocols), headers, ctx)
    if session is None or runner is None:
        return result
    error = await session.open({"streamtype": ["error"]})
    streams: dict[str, spdy.SpdyStream] = {}
    if stdin is not None:
        streams["stdin"] = await session.open({"streamtype": ["stdin"]})
    if stdout:
        streams["stdout"] = await session.open({"streamtype": ["stdout"]})
    if stderr and not tty:
        streams["stderr"] = await session.open({"streamtype": ["stderr"]})
    if tty:
        streams["resize"] = await session.open({"streamtype": ["resize"]})
        if resize is not None:
            await streams["resize"].write(json.dumps(
                {"Width": resize[0], "Height": resize[1]}).encode())
    prompted = asyncio.Event()  # stdin is typed once stdout showed ``stdin_after``

    async def type_in() -> None:
        if stdin is None:
            return
        if stdin_after:
            await prompted.wait()
        await streams["stdin"].write(stdin)
        if close_stdin:
            await streams["stdin"].close()

    async def drain(stream: spdy.SpdyStream | None) -> bytes:
        out = b""
        while stream is not None and (chunk := await stream.read()):
            out += chunk
            if on_stdout is not None and stream is streams.get("stdout"):
                on_stdout(chunk)
            if stdin_after in out:
                prompted.set()
        prompted.set()
        return out
    result.stdout, result.stderr, result.error, _ = await asyncio.gather(
        drain(streams.get("stdout")), drain(streams.get("stderr")), drain(error), type_in())
    await session.close(wait_for_peer=10.0)
    await runner
    return result


async def spdy_port_forward(url: str, port: int, payload: bytes, *, half_close: bool = False,
                            headers: dict[str, str] | None = None,
                            ctx: ssl.SSLContext | None = None) -> Result:
    """One request over a forwarded port: the reply bytes until the pod's side closes."""
    result, session, runner = await _upgrade(url, ["portforward.k8s.io"], headers, ctx)
    if session is None or runner is None:
        return result
    base = {"port": [str(port)], "requestid": ["0"]}
    error = await session.open({**base, "streamtype": ["error"]})
    data = await session.open({**base, "streamtype": ["data"]})
    await data.write(payload)
    if half_close:
        await data.close()

    async def drain(stream: spdy.SpdyStream) -> bytes:
        out = b""
        while chunk := await stream.read():
            out += chunk
        return out
    result.stdout, result.error = await asyncio.gather(drain(data), drain(error))
    await session.close(wait_for_peer=10.0)
    await runner
    return result
