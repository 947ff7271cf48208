"""The embedded runtime's streaming server (CRI ``Exec``), as containerd's: HTTP on 127.0.0.1
(a random port), one single-use token per ``Exec`` call in the returned URL, expiring after
``TOKEN_TTL`` seconds unused.

``GET /exec/{token}`` upgrades to a WebSocket speaking ``v5.channel.k8s.io`` or
``v4.channel.k8s.io``: every binary message starts with its channel byte (0 stdin, 1 stdout,
2 stderr, 3 error: the final ``metav1.Status`` as JSON, with the exit code, 4 resize); v5 adds
``255 <channel>`` to close a channel (stdin: the command sees end of file). The command runs
in the container's context exactly as ExecSync's (``execsync.exec_command``). TTY is refused
(400): not built yet.

The server runs its own event loop in a thread of the runtime process; the gRPC handlers only
register tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import WSMsgType, web

from podvisor.services.runtime.faults import invalid

TOKEN_TTL = 60.0
PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
CHUNK = 32 * 1024

Clock = Callable[[], float]
# container_id, cmd -> argv, env, cwd (raises Fault when the container cannot exec)
Prepare = Callable[[str, Sequence[str]], tuple[list[str], dict[str, str], str]]


@dataclass(frozen=True)
class ExecRequest:
    container_id: str
    cmd: tuple[str, ...]
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


def exit_status(code: int) -> dict[str, Any]:
    """The ``metav1.Status`` the API server and kubectl read from the error channel."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure",
            "message": f"command terminated with non-zero exit code: exit status {code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


def failure_status(message: str) -> dict[str, Any]:
    return {"metadata": {}, "status": "Failure", "message": message,
            "reason": "InternalError", "code": 500}


class StreamingServer:
    def __init__(self, prepare: Prepare, log: Any, clock: Clock,
                 host: str = "127.0.0.1", ttl: float = TOKEN_TTL) -> None:
        self._prepare = prepare
        self._log = log
        self._clock = clock
        self._host = host
        self._ttl = ttl
        self._tokens: dict[str, tuple[float, ExecRequest]] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- tokens (called from gRPC threads) --------------------------------------------------

    def exec_url(self, req: ExecRequest) -> str:
        if not req.cmd:
            raise invalid("exec: empty command")
        if not (req.stdin or req.stdout or req.stderr):
            raise invalid("exec: one of stdin, stdout or stderr must be requested")
        if req.tty:
            raise invalid("exec: tty is not supported by the embedded runtime yet")
        if req.tty and req.stderr:
            raise invalid("exec: tty and stderr cannot both be true")
        token = secrets.token_urlsafe(12)
        now = self._clock()
        with self._lock:
            for old in [t for t, (exp, _) in self._tokens.items() if exp <= now]:
                del self._tokens[old]
            self._tokens[token] = (now + self._ttl, req)
        return f"http://{self._host}:{self.port}/exec/{token}"

    def _take(self, token: str) -> ExecRequest | None:
        with self._lock:
            entry = self._tokens.pop(token, None)
        if entry is None or entry[0] <= self._clock():
            return None
        return entry[1]

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        started = threading.Event()
        error: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve())
            except BaseException as err:  # reported to start()
                error.append(err)
                started.set()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="cri-streaming", daemon=True)
        self._thread.start()
        started.wait()
        if error:
            raise error[0]
        self._log.info("runtime.streaming_serving", host=self._host, port=self.port)

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_get("/exec/{token}", self._exec)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def _cleanup(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        self._loop = self._thread = None

    # -- exec -------------------------------------------------------------------------------

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        req = self._take(request.match_info["token"])
        if req is None:
            return web.Response(status=404, text="unknown or expired exec token\n")
        ws = web.WebSocketResponse(protocols=PROTOCOLS, max_msg_size=0)
        if not ws.can_prepare(request).ok:
            return web.Response(status=400, text="exec needs a WebSocket upgrade with one of "
                                                 f"the protocols {', '.join(PROTOCOLS)}\n")
        await ws.prepare(request)
        v5 = ws.ws_protocol == PROTOCOLS[0]
        log = self._log
        try:
            argv, env, cwd = self._prepare(req.container_id, req.cmd)
            proc = await asyncio.create_subprocess_exec(
                *argv, env=env, cwd=cwd, start_new_session=True,
                stdin=asyncio.subprocess.PIPE if req.stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE if req.stdout else asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE if req.stderr else asyncio.subprocess.DEVNULL)
        except Exception as err:  # a Fault or OSError: report it on the error channel
            message = getattr(err, "message", None) or str(err)
            await _send(ws, ERROR, json.dumps(failure_status(message)).encode())
            await ws.close()
            return ws
        log.info("runtime.exec_started", container=req.container_id, cmd=list(req.cmd)[:1])
        try:
            code = await self._pump(ws, proc, v5)
        finally:
            if proc.returncode is None:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        code = 128 - code if code < 0 else code
        log.info("runtime.exec_finished", container=req.container_id, exit_code=code)
        if not ws.closed:
            await _send(ws, ERROR, json.dumps(exit_status(code)).encode())
            await ws.close()
        return ws

    async def _pump(self, ws: web.WebSocketResponse, proc: asyncio.subprocess.Process,
                    v5: bool) -> int:
        async def copy_out(stream: asyncio.StreamReader | None, channel: int) -> None:
            if stream is None:
                return
            while chunk := await stream.read(CHUNK):
                await _send(ws, channel, chunk)

        async def copy_in() -> None:
            async for msg in ws:
                if msg.type is not WSMsgType.BINARY or not msg.data:
                    continue
                data: bytes = msg.data
                channel = data[0]
                if channel == STDIN and proc.stdin is not None and len(data) > 1:
                    proc.stdin.write(data[1:])
                    with contextlib.suppress(ConnectionError):
                        await proc.stdin.drain()
                elif v5 and channel == CLOSE and data[1:2] == bytes([STDIN]) and proc.stdin:
                    proc.stdin.close()
            # the client went away: nobody reads the command's output any more
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)

        reader = asyncio.ensure_future(copy_in())
        try:
            await asyncio.gather(copy_out(proc.stdout, STDOUT), copy_out(proc.stderr, STDERR))
            return await proc.wait()
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


async def _send(ws: web.WebSocketResponse, channel: int, data: bytes) -> None:
    with contextlib.suppress(ConnectionError):
        await ws.send_bytes(bytes([channel]) + data)
