"""The embedded runtime's streaming server (CRI ``Exec``), as containerd's: HTTP on 127.0.0.1
(a random port), one single-use token per ``Exec`` call in the returned URL, expiring after
``TOKEN_TTL`` seconds unused.

``/exec/{token}`` (GET or POST) upgrades to either protocol a kubelet's streaming server speaks:

- WebSocket ``v5.channel.k8s.io`` or ``v4.channel.k8s.io``: every binary message starts with
  its channel byte (0 stdin, 1 stdout, 2 stderr, 3 error: the final ``metav1.Status`` as JSON,
  with the exit code, 4 resize); v5 adds ``255 <channel>`` to close a channel (stdin: the
  command sees end of file).
- SPDY/3.1 (``podvisor.common.spdy``) with ``X-Stream-Protocol-Version`` v4/v3/v2
  ``.channel.k8s.io`` (what the API server, kubectl and crictl send): the client opens one
  SPDY stream per channel, named by its ``streamType`` header (error, stdin, stdout, stderr,
  resize), within ``STREAM_CREATION_TIMEOUT``; v4's status is the ``metav1.Status`` JSON,
  v2/v3's the error text.

TTY: the command gets a pty as stdin, stdout and stderr and controlling terminal; its output is
the stdout channel; resize messages (``{"Width": cols, "Height": rows}``) set the window size;
the client's end of stdin types ^D. The command runs in the container's context exactly as
ExecSync's (``execsync.exec_command``).

The server runs its own event loop in a thread of the runtime process; the gRPC handlers only
register tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import secrets
import shutil
import signal
import struct
import termios
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import WSMsgType, web

from podvisor.common.spdy import REFUSED_STREAM, Session, SpdyStream
from podvisor.common.upgrade import finish_hijacked, hijack
from podvisor.services.runtime.faults import invalid, precondition

TOKEN_TTL = 60.0
PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
SPDY_PROTOCOLS = ("v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io")
STREAM_CREATION_TIMEOUT = 30.0  # the kubelet's streamCreationTimeout
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
CHUNK = 32 * 1024

Clock = Callable[[], float]
# container_id, cmd -> argv, env, cwd (raises Fault when the container cannot exec)
Prepare = Callable[[str, Sequence[str]], tuple[list[str], dict[str, str], str]]


@dataclass(frozen=True)
class PortForwardRequest:
    sandbox_id: str
    ports: tuple[int, ...]  # from the CRI request; a client may ask for others


@dataclass(frozen=True)
class ExecRequest:
    container_id: str
    cmd: tuple[str, ...]
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


@dataclass(frozen=True)
class AttachRequest:
    """Attach to a container's main process: its output as its CRI log file has it, from now
    until the container exits (the embedded runtime's containers have no stdin and no
    terminal: their stdio is the log pipe to their monitor)."""
    container_id: str
    log_path: str
    stdout: bool
    stderr: bool
    running: Callable[[], bool] = field(compare=False, repr=False, default=lambda: False)
    stdin: bool = False
    tty: bool = False


Request = ExecRequest | PortForwardRequest | AttachRequest


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

    # -- exec -------------------------------------------------------------------------------

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        req = self._take(request.match_info["token"])
        kind = request.path.split("/")[1]
        if not isinstance(req, ExecRequest if kind == "exec" else AttachRequest):
            return web.Response(status=404, text=f"unknown or expired {kind} token\n")
        if request.headers.get("Upgrade", "").lower().startswith("spdy/"):
            return await self._exec_spdy(request, req)
        ws = web.WebSocketResponse(protocols=PROTOCOLS, max_msg_size=0)
        if not ws.can_prepare(request).ok:
            return web.Response(status=400, text="exec needs an upgrade: WebSocket with one "
                                f"of the protocols {', '.join(PROTOCOLS)}, or SPDY/3.1 with "
                                f"{', '.join(SPDY_PROTOCOLS)}\n")
        await ws.prepare(request)
        v5 = ws.ws_protocol == PROTOCOLS[0]

        async def send(channel: int, data: bytes) -> None:
            await _send(ws, channel, data)

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

        status = await self._run(req, send, feed)
        if not ws.closed:
            await _send(ws, ERROR, json.dumps(status).encode())
            await ws.close()
        return ws

    async def _exec_spdy(self, request: web.Request,
                         req: ExecRequest | AttachRequest) -> web.StreamResponse:
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
            self._log.warning("runtime.exec_streams_missing", container=req.container_id,
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

        status = await self._run(req, send, feed)
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

    async def _run(self, req: ExecRequest | AttachRequest, send: Send,
                   feed: Callable[[Streamed], Awaitable[None]]) -> dict[str, Any]:
        """Run the command with its streams (or follow the attached container's output);
        the final ``metav1.Status``."""
        if isinstance(req, AttachRequest):
            return await self._follow(req, send, feed)
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

    async def _follow(self, req: AttachRequest, send: Send,
                      feed: Callable[[Streamed], Awaitable[None]]) -> dict[str, Any]:
        """Attach: the container's CRI log from its current end on, each line to its stream's
        channel, until the container is no longer running (then what is left is sent) or the
        client goes away. The file is read every ``ATTACH_POLL`` seconds (and reopened from
        its start when it was rotated)."""
        follower = Follower()
        feeder = asyncio.ensure_future(feed(follower))
        self._log.info("runtime.attach_started", container=req.container_id)
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
        self._log.info("runtime.attach_finished", container=req.container_id)
        return {"metadata": {}, "status": "Success"}


    # -- port forward -----------------------------------------------------------------------

    async def _port_forward(self, request: web.Request) -> web.StreamResponse:
        req = self._take(request.match_info["token"])
        if not isinstance(req, PortForwardRequest):
            return web.Response(status=404, text="unknown or expired port forward token\n")
        if request.headers.get("Upgrade", "").lower().startswith("spdy/"):
            return await self._port_forward_spdy(request, req)
        return await self._port_forward_ws(request, req)

    async def _port_forward_spdy(self, request: web.Request,
                                 req: PortForwardRequest) -> web.StreamResponse:
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
        self._log.info("runtime.port_forward_started", sandbox=req.sandbox_id)
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
                    task = asyncio.ensure_future(self._forward_spdy(
                        req, pair["data"].header("port"), pair["data"], pair["error"]))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        finally:
            for pending in list(tasks):
                pending.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await session.close(wait_for_peer=1.0)
            await runner
        self._log.info("runtime.port_forward_finished", sandbox=req.sandbox_id)
        return finish_hijacked()

    async def _forward_spdy(self, req: PortForwardRequest, port_text: str,
                            data: SpdyStream, error: SpdyStream) -> None:
        try:
            port = int(port_text)
            if not 0 < port < 65536:
                raise ValueError(port_text)
            target = await connect_port(port)
        except (ValueError, OSError) as exc:
            message = (f"invalid port {port_text!r}" if isinstance(exc, ValueError) else
                       f"failed to connect to localhost:{port_text} in pod sandbox "
                       f"{req.sandbox_id}: {exc}")
            self._log.warning("runtime.port_forward_failed", sandbox=req.sandbox_id,
                              error=message)
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

    async def _port_forward_ws(self, request: web.Request,
                               req: PortForwardRequest) -> web.StreamResponse:
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
                t_reader, t_writer = await connect_port(port)
            except OSError as exc:
                for channel in (2 * i, 2 * i + 1):
                    await _send(ws, channel, port.to_bytes(2, "little"))
                await _send(ws, 2 * i + 1, f"failed to connect to localhost:{port} in pod "
                                           f"sandbox {req.sandbox_id}: {exc}".encode())
                return
            writers[i] = t_writer
            for channel in (2 * i, 2 * i + 1):
                await _send(ws, channel, port.to_bytes(2, "little"))
            with contextlib.suppress(ConnectionError, OSError):
                while chunk := await t_reader.read(CHUNK):
                    await _send(ws, 2 * i, chunk)
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


class Streamed(Protocol):
    """What a client's input drives: an exec'd command (``Proc``) or an attach
    (``Follower``)."""

    async def write_stdin(self, data: bytes) -> None: ...
    def close_stdin(self) -> None: ...
    def resize(self, size: Any) -> None: ...
    def resize_json(self, data: bytes) -> None: ...
    def kill(self) -> None: ...


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


PORT_FORWARD_PROTOCOLS = ("portforward.k8s.io",)
WS_PORT_FORWARD_PROTOCOLS = ("v4.channel.k8s.io", "portforward.k8s.io")


async def connect_port(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The port on the sandbox's localhost: the embedded runtime's sandboxes share the host's
    network namespace (no network namespaces of their own)."""
    try:
        return await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return await asyncio.open_connection("::1", port)


Send = Callable[[int, bytes], Awaitable[None]]
CHANNEL_NAMES = {STDIN: "stdin", STDOUT: "stdout", STDERR: "stderr", ERROR: "error",
                 RESIZE: "resize"}


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


async def _send(ws: web.WebSocketResponse, channel: int, data: bytes) -> None:
    with contextlib.suppress(ConnectionError):
        await ws.send_bytes(bytes([channel]) + data)
