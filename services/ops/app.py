"""The aiohttp application of the ops port: HTTP Basic auth on every path, ``/RPC2``.

``check_auth`` compares credentials in constant time; a request without valid credentials gets
401 with ``WWW-Authenticate: Basic realm="podvisor"`` (so browsers ask, supervisorctl reports
"Server requires authentication"). ``POST /RPC2`` runs the XML-RPC dispatcher on a worker
thread (its methods block on control and CRI calls) and answers ``text/xml``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from xmlrpc.server import SimpleXMLRPCDispatcher

from aiohttp import web

__all__ = ["check_auth", "make_app"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_RPC_BODY = 4 << 20


def check_auth(header: str | None, username: str, password: str) -> bool:
    """True when ``header`` is ``Basic base64(username:password)`` for these credentials."""
    if not header or header[:6].lower() != "basic ":
        return False
    try:
        user, sep, given = base64.b64decode(header[6:].strip(), validate=True).decode(
            "utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return False
    ok_user = hmac.compare_digest(user.encode(), username.encode())
    ok_pass = hmac.compare_digest(given.encode(), password.encode())
    return bool(sep) and ok_user and ok_pass


def unauthorized() -> web.Response:
    return web.Response(status=401, text="401 Unauthorized: HTTP Basic credentials required\n",
                        headers={"WWW-Authenticate": 'Basic realm="podvisor"'})


def make_app(dispatcher: SimpleXMLRPCDispatcher, username: str, password: str,
             extra_routes: Callable[[web.Application, Executor], object] | None = None,
             workers: int = 8) -> web.Application:
    executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rpc")

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not check_auth(request.headers.get("Authorization"), username, password):
            return unauthorized()
        return await handler(request)

    async def rpc2(request: web.Request) -> web.Response:
        body = await request.read()
        loop = asyncio.get_running_loop()
        data = await loop.run_in_executor(executor, dispatcher._marshaled_dispatch, body)
        return web.Response(body=data, content_type="text/xml", charset="utf-8")

    async def close_executor(app: web.Application) -> None:
        executor.shutdown(wait=False, cancel_futures=True)

    app = web.Application(middlewares=[auth], client_max_size=MAX_RPC_BODY)
    app.router.add_post("/RPC2", rpc2)
    if extra_routes is not None:
        extra_routes(app, executor)
    app.on_cleanup.append(close_executor)
    return app
