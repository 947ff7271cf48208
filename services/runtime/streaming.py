"""The embedded runtime's streaming server (CRI ``Exec``, ``Attach``, ``PortForward``), as
containerd's: HTTP on 127.0.0.1 (a random port), one single-use token per CRI call in the
returned URL, expiring after ``TOKEN_TTL`` seconds unused.

``/exec/{token}`` and ``/attach/{token}`` (GET or POST) upgrade to either protocol a kubelet's
streaming server speaks:

- WebSocket ``v5.channel.k8s.io`` or ``v4.channel.k8s.io`` (``stream_ws.py``): every binary
  message starts with its channel byte (0 stdin, 1 stdout, 2 stderr, 3 error: the final
  ``metav1.Status`` as JSON, with the exit code, 4 resize); v5 adds ``255 <channel>`` to close
  a channel (stdin: the command sees end of file).
- SPDY/3.1 (``podvisor.common.spdy``; ``stream_spdy.py``) with ``X-Stream-Protocol-Version``
  v4/v3/v2 ``.channel.k8s.io`` (what the API server, kubectl and crictl send): the client opens
  one SPDY stream per channel, named by its ``streamType`` header (error, stdin, stdout,
  stderr, resize), within ``STREAM_CREATION_TIMEOUT``; v4's status is the ``metav1.Status``
  JSON, v2/v3's the error text.

``/portforward/{token}``: SPDY or WebSocket (``stream_portforward.py``). An attach follows the
container's CRI log (``stream_attach.py``).

TTY: the command gets a pty as stdin, stdout and stderr and controlling terminal; its output is
the stdout channel; resize messages (``{"Width": cols, "Height": rows}``) set the window size;
the client's end of stdin types ^D (``stream_pty.py``). The command runs in the container's
context exactly as ExecSync's (``execsync.exec_command``).

The server runs its own event loop in a thread of the runtime process; the gRPC handlers only
register tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from podvisor.services.runtime.faults import invalid, precondition
from podvisor.services.runtime.stream_attach import follow
from podvisor.services.runtime.stream_base import (
    STDERR,
    STDOUT,
    AttachRequest,
    ExecRequest,
    Feed,
    PortForwardRequest,
    Request,
    Send,
    exit_status,
    failure_status,
)
from podvisor.services.runtime.stream_portforward import port_forward_spdy, port_forward_ws
from podvisor.services.runtime.stream_pty import Proc
from podvisor.services.runtime.stream_spdy import exec_spdy
from podvisor.services.runtime.stream_ws import exec_ws

__all__ = ["TOKEN_TTL", "AttachRequest", "ExecRequest", "PortForwardRequest", "StreamingServer"]

TOKEN_TTL = 60.0

Clock = Callable[[], float]
# container_id, cmd -> argv, env, cwd (raises Fault when the container cannot exec)
Prepare = Callable[[str, Sequence[str]], tuple[list[str], dict[str, str], str]]


class StreamingServer:
    def __init__(self, prepare: Prepare, log: Any, clock: Clock,
                 host: str = "127.0.0.1", ttl: float = TOKEN_TTL) -> None:
        self._prepare = prepare
        self._log = log
        self._clock = clock
        self._host = host
        self._ttl = ttl
        self._tokens: dict[str, tuple[float, Request]] = {}
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
        if req.tty and req.stderr:
            raise invalid("exec: tty and stderr cannot both be true")
        return self._url("exec", req)

    def attach_url(self, req: AttachRequest) -> str:
        if not (req.stdout or req.stderr):
            raise invalid("attach: one of stdout or stderr must be requested")
        if not req.log_path:
            raise precondition(f"attach: container {req.container_id} has no log to follow")
        return self._url("attach", req)

    def port_forward_url(self, req: PortForwardRequest) -> str:
        for port in req.ports:
            if not 0 < port < 65536:
                raise invalid(f"port forward: invalid port {port}")
        return self._url("portforward", req)

    def _url(self, kind: str, req: Request) -> str:
        token = secrets.token_urlsafe(12)
        now = self._clock()
        with self._lock:
            for old in [t for t, (exp, _) in self._tokens.items() if exp <= now]:
                del self._tokens[old]
            self._tokens[token] = (now + self._ttl, req)
        return f"http://{self._host}:{self.port}/{kind}/{token}"

    def _take(self, token: str) -> Request | None:
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
        for method in ("GET", "POST"):  # WebSocket clients GET, client-go's SPDY POSTs
            app.router.add_route(method, "/exec/{token}", self._exec)
            app.router.add_route(method, "/attach/{token}", self._exec)
            app.router.add_route(method, "/portforward/{token}", self._port_forward)
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

    # -- exec and attach ----------------------------------------------------------------------

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        req = self._take(request.match_info["token"])
        kind = request.path.split("/")[1]
        if not isinstance(req, ExecRequest if kind == "exec" else AttachRequest):
            return web.Response(status=404, text=f"unknown or expired {kind} token\n")
        if request.headers.get("Upgrade", "").lower().startswith("spdy/"):
            return await exec_spdy(request, req, self._run, self._log)
        return await exec_ws(request, req, self._run)

    async def _run(self, req: ExecRequest | AttachRequest, send: Send,
                   feed: Feed) -> dict[str, Any]:
        """Run the command with its streams (or follow the attached container's output);
        the final ``metav1.Status``."""
        if isinstance(req, AttachRequest):
            return await follow(req, send, feed, self._log)
        try:
            argv, env, cwd = self._prepare(req.container_id, req.cmd)
            proc = await Proc.spawn(argv, env, cwd, stdin=req.stdin, stdout=req.stdout,
                                    stderr=req.stderr, tty=req.tty)
        except Exception as err:  # a Fault or OSError: reported on the error channel
            message = getattr(err, "message", None) or str(err)
            return failure_status(message)
        self._log.info("runtime.exec_started", container=req.container_id,
                       cmd=list(req.cmd)[:1], tty=req.tty)
        feeder = asyncio.ensure_future(feed(proc))
        try:
            await asyncio.gather(proc.copy_out(STDOUT, send), proc.copy_out(STDERR, send))
            code = await proc.wait()
        finally:
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder
            await proc.reap()
        self._log.info("runtime.exec_finished", container=req.container_id, exit_code=code)
        return exit_status(code)

    # -- port forward -----------------------------------------------------------------------

    async def _port_forward(self, request: web.Request) -> web.StreamResponse:
        req = self._take(request.match_info["token"])
        if not isinstance(req, PortForwardRequest):
            return web.Response(status=404, text="unknown or expired port forward token\n")
        if request.headers.get("Upgrade", "").lower().startswith("spdy/"):
            return await port_forward_spdy(request, req, self._log)
        return await port_forward_ws(request, req)
