"""supervisord's log-following HTTP streams on the ops port (its ``http.py``
``logtail_handler`` / ``mainlogtail_handler``), which ``supervisorctl tail -f`` and
``maintail -f`` read with their own HTTP/1.1 client:

- ``GET /logtail/{group:name}`` and ``/logtail/{group:name}/{stdout|stderr}``: the process's
  log file (a subsystem's ``logs/<name>.log``; a container's CRI log, both streams in one file,
  as ``readProcessStderrLog``); ``GET /mainlogtail``: the supervisor's ``logs/supervisor.log``.
- 404 for an unknown process or channel or a log file that does not exist (yet), 400 for a method
  other than GET (the auth middleware answers 401 first, like every route).
- 200 ``text/plain;charset=utf-8`` with ``Last-Modified`` and ``X-Accel-Buffering: no``, no
  Content-Length (so chunked): the last ``HEAD`` bytes, then whatever is appended, for as long as
  the client stays (a never-ending body). A truncated file writes ``==> File truncated <==`` and
  goes on from its start; a file replaced under its path (rotation) is reopened. A container's
  log moves to a new file when the kubelet restarts it: the stream then follows the new file
  from its start (looked up every ``RESOLVE`` seconds).

``LogFollower`` is supervisord's ``tail_f_producer`` (pure file reads, no clock); the handler
polls it every ``POLL`` seconds, as supervisord's producer is polled every 0.1 s.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import stat
import xmlrpc.client
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path

from aiohttp import web

from podvisor.services.ops.procs import Proc

__all__ = ["HEAD", "LogFollower", "add_logtail"]

HEAD = 1024  # bytes of the existing log sent first (supervisord's ``tail_f_producer(.., 1024)``)
POLL = 0.1
RESOLVE = 1.0
CHUNK = 65536
TRUNCATED = b"==> File truncated <==\n"
CHANNELS = ("stdout", "stderr")


class LogFollower:
    """Follows one log file: ``more()`` returns what was appended since the last call (the last
    ``head`` bytes at first), ``TRUNCATED`` when the file shrank, ``b""`` when nothing moved."""

    def __init__(self, path: str, head: int = HEAD) -> None:
        self.path = path
        self._open()
        size = self._size()
        self.pos = max(0, size - head)

    def _open(self) -> None:
        self.file = open(self.path, "rb")  # noqa: SIM115 (held across calls; close())
        self.ino = os.fstat(self.file.fileno()).st_ino
        self.pos = 0

    def _size(self) -> int:
        return os.fstat(self.file.fileno()).st_size

    def _follow(self) -> None:
        try:
            ino = os.stat(self.path).st_ino
        except OSError:
            return  # unlinked: keep reading what we hold
        if ino != self.ino:  # rotated: the path names a new file, read it from its start
            self.file.close()
            self._open()

    def switch(self, path: str) -> None:
        """Follow another file from its start (a container's new log after a restart)."""
        self.file.close()
        self.path = path
        self._open()

    def more(self) -> bytes:
        self._follow()
        size = self._size()
        if size < self.pos:
            self.pos = 0
            return TRUNCATED
        if size == self.pos:
            return b""
        self.file.seek(self.pos)
        data = self.file.read(min(size - self.pos, CHUNK))
        self.pos += len(data)
        return data

    def close(self) -> None:
        self.file.close()


def _http_date(path: str) -> str:
    try:
        return email.utils.formatdate(os.stat(path).st_mtime, usegmt=True)
    except OSError:
        return email.utils.formatdate(usegmt=True)


async def _stream(request: web.Request, path: str, resolve: Callable[[], str] | None,
                  executor: Executor | None) -> web.StreamResponse:
    """The never-ending body following ``path`` (``resolve``: where the log is now)."""
    if not path or not stat.S_ISREG(_mode(path)):
        raise web.HTTPNotFound()
    follower = LogFollower(path)
    resp = web.StreamResponse(headers={"Content-Type": "text/plain;charset=utf-8",
                                       "Last-Modified": _http_date(path),
                                       "X-Accel-Buffering": "no"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    loop = asyncio.get_running_loop()
    since_resolve = 0.0
    try:
        while request.transport is not None and not request.transport.is_closing():
            data = follower.more()
            if data:
                await resp.write(data)
                continue
            since_resolve += POLL
            if resolve is not None and since_resolve >= RESOLVE:
                since_resolve = 0.0
                now = await loop.run_in_executor(executor, _quiet(resolve))
                if now and now != follower.path and os.path.exists(now):
                    follower.switch(now)
                    continue
            await asyncio.sleep(POLL)
    except (ConnectionResetError, OSError):
        pass  # the client went away
    finally:
        follower.close()
    return resp


def _mode(path: str) -> int:
    try:
        return os.stat(path).st_mode
    except OSError:
        return 0


def _quiet(resolve: Callable[[], str]) -> Callable[[], str]:
    def call() -> str:
        try:
            return resolve()
        except (xmlrpc.client.Fault, OSError):
            return ""
    return call


def add_logtail(app: web.Application, find: Callable[[str], Proc], logs_dir: Path,
                executor: Executor) -> None:
    """The routes; ``find(namespec)`` is ``OpsRpc.find_proc`` (blocking: run on ``executor``;
    raises the BAD_NAME fault for an unknown process)."""

    async def logtail(request: web.Request) -> web.StreamResponse:
        spec, channel = request.match_info["spec"], request.match_info.get("channel", "stdout")
        if channel not in CHANNELS:
            raise web.HTTPNotFound()
        loop = asyncio.get_running_loop()
        try:
            proc = await loop.run_in_executor(executor, find, spec)
        except xmlrpc.client.Fault:
            raise web.HTTPNotFound() from None
        resolve = None
        if proc.kind == "container":
            def resolve() -> str:
                return find(spec).logfile
        return await _stream(request, proc.logfile, resolve, executor)

    async def mainlogtail(request: web.Request) -> web.StreamResponse:
        return await _stream(request, str(logs_dir / "supervisor.log"), None, None)

    async def not_get(request: web.Request) -> web.StreamResponse:
        raise web.HTTPBadRequest()

    for path in ("/logtail/{spec}", "/logtail/{spec}/{channel}", "/mainlogtail"):
        handler = mainlogtail if path == "/mainlogtail" else logtail
        app.router.add_get(path, handler, allow_head=False)
        app.router.add_route("*", path, not_get)
