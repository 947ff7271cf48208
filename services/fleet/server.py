"""The fleet page's server: one aiohttp app over every node's link (HTTP Basic on every path).

- ``GET /``, ``/static/*``: the fleet page (no CDN).
- ``GET /api/fleet``: the fleet's state (``model.fleet_state``).
- ``GET /api/fleet/events``: its live feed, as the node page's: ``fleet`` (the state, time and
  the usage figures aside) when it changed, at most every ``MIN_GAP``; ``usage`` (each node's
  subsystems' and pods' last sample) at most every ``USAGE_GAP``; ``ping`` every
  ``KEEPALIVE`` otherwise. One broadcaster while a page listens, woken by the links.
- ``POST /api/nodes/NODE/action`` ``{action, name, signal?}``: the node's ``/api/action`` with
  the node's credentials (its answer passed through; 404 for an unknown node, 502 when it
  does not answer).
- ``/nodes/NODE/...``: a reverse proxy to the node's ops port with its credentials: the
  node's own page (drill-down: ``/nodes/NODE/``), its feed, its actions, its ``/RPC2``.
- ``POST /RPC2``: the fleet's XML-RPC (``rpc.py``), on a worker thread.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from podvisor.ipc.clock import Clock
from podvisor.services.fleet.link import NodeLink
from podvisor.services.fleet.model import fleet_state
from podvisor.services.fleet.rpc import FleetRpc, new_fleet_dispatcher
from podvisor.services.ops import check_auth

__all__ = ["Fleet", "make_fleet_app"]

STATIC = Path(__file__).parent / "static"
MIN_GAP = 0.1
USAGE_GAP = 2.5
KEEPALIVE = 15.0
PROXY_HEADERS = ("Content-Type", "Accept", "Cache-Control", "Last-Event-ID")
BACK_HEADERS = ("Content-Type", "Cache-Control", "Last-Modified", "X-Accel-Buffering")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _frame(event: str, data: str) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + data.encode() + b"\n\n"


class Fleet:
    """The links by node name, the feed's clients and its broadcaster (event loop thread)."""

    def __init__(self, session: aiohttp.ClientSession, clock: Clock) -> None:
        self.session, self.clock = session, clock
        self.links: dict[str, NodeLink] = {}
        self.clients: set[asyncio.Queue[bytes]] = set()
        self._moved = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.last_key: str | None = None
        self.last_usage: str | None = None
        self.sends = 0

    def changed(self) -> None:
        """A link's view changed (the links call this)."""
        self._moved.set()

    def nodes(self) -> dict[str, Any]:
        """name -> (view, spec): what the XML-RPC threads read (immutable values)."""
        return {n: (link.view, link.spec) for n, link in list(self.links.items())}

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the fleet's state without usage figures, {node: usage})."""
        views = [link.view for _, link in sorted(self.links.items())]
        state = fleet_state(views, self.clock.wall())
        usage = {}
        for node in state["nodes"]:
            usage[node["name"]] = node.pop("usage")
        return state, usage

    def _send(self, data: bytes) -> None:
        for q in list(self.clients):
            if q.qsize() < 4:
                q.put_nowait(data)

    async def broadcast(self) -> None:
        loop = asyncio.get_running_loop()
        last_send = last_usage = -1e18
        try:
            while self.clients:
                self._moved.clear()
                state, usage = self.state()
                now = loop.time()
                key = _dumps({k: v for k, v in state.items() if k != "now"})
                if key != self.last_key:
                    self.last_key = key
                    self._send(_frame("fleet", _dumps(state)))
                    self.sends += 1
                    last_send = now
                text = _dumps(usage)
                if text != self.last_usage and now >= last_usage + USAGE_GAP:
                    self.last_usage, last_usage = text, now
                    self._send(_frame("usage", _dumps({"now": state["now"], "nodes": usage})))
                    last_send = now
                if now >= last_send + KEEPALIVE:
                    self._send(_frame("ping", _dumps({"now": state["now"],
                                                      "every": KEEPALIVE})))
                    last_send = now
                wait = last_send + KEEPALIVE - now
                if text != self.last_usage:
                    wait = min(wait, last_usage + USAGE_GAP - now)
                try:
                    await asyncio.wait_for(self._moved.wait(), max(0.0, wait))
                except TimeoutError:
                    continue
                await asyncio.sleep(MIN_GAP)  # a burst of changes makes one state
        finally:
            self._task = None

    def subscribe(self) -> asyncio.Queue[bytes]:
        q: asyncio.Queue[bytes] = asyncio.Queue()
        q.put_nowait(b"retry: 1000\n\n")
        state, usage = self.state()
        q.put_nowait(_frame("fleet", _dumps(state)))
        q.put_nowait(_frame("usage", _dumps({"now": state["now"], "nodes": usage})))
        self.clients.add(q)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.broadcast())
        return q

    # -- routes ------------------------------------------------------------------------
    async def index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "fleet.html")

    async def api_state(self, request: web.Request) -> web.Response:
        state, usage = self.state()
        for node in state["nodes"]:
            node["usage"] = usage[node["name"]]
        return web.json_response(state)

    async def events(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        q = self.subscribe()
        try:
            while True:
                await resp.write(await q.get())
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.clients.discard(q)
        return resp

    def _link(self, request: web.Request) -> NodeLink:
        link = self.links.get(request.match_info["node"])
        if link is None:
            raise web.HTTPNotFound(text=f"no node {request.match_info['node']!r} in the fleet\n")
        return link

    async def action(self, request: web.Request) -> web.Response:
        link = self._link(request)
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"faultString": "need JSON {action, name}"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"faultString": "need JSON {action, name}"}, status=400)
        status, answer = await link.post("/api/action", body)
        return web.json_response(answer, status=status)

    async def redirect(self, request: web.Request) -> web.Response:
        self._link(request)
        raise web.HTTPFound(f"/nodes/{request.match_info['node']}/")

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        """The node's ops port under ``/nodes/NODE/``, with its credentials; streamed (its
        feed and log tails are long responses)."""
        link = self._link(request)
        url = f"{link.spec.url}/{request.match_info['tail']}"
        headers = {h: request.headers[h] for h in PROXY_HEADERS if h in request.headers}
        body = await request.read()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=link.timeout)
        try:
            async with self.session.request(
                    request.method, url, params=request.query, data=body or None,
                    headers=headers, auth=link.auth, ssl=link.ssl, timeout=timeout) as up:
                resp = web.StreamResponse(status=up.status, headers={
                    h: up.headers[h] for h in BACK_HEADERS if h in up.headers})
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            return web.Response(status=502, text=f"node {link.spec.name}: {err}\n")


def make_fleet_app(fleet: Fleet, rpc: FleetRpc, username: str, password: str) -> web.Application:
    dispatcher = new_fleet_dispatcher(rpc)
    executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fleet-rpc")

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not check_auth(request.headers.get("Authorization"), username, password):
            return web.Response(status=401, text="401 Unauthorized\n",
                                headers={"WWW-Authenticate": 'Basic realm="podvisor fleet"'})
        return await handler(request)

    async def rpc2(request: web.Request) -> web.Response:
        body = await request.read()
        data = await asyncio.get_running_loop().run_in_executor(
            executor, dispatcher._marshaled_dispatch, body)
        return web.Response(body=data, content_type="text/xml", charset="utf-8")

    async def close_executor(app: web.Application) -> None:
        executor.shutdown(wait=False, cancel_futures=True)

    app = web.Application(middlewares=[auth], client_max_size=4 << 20)
    app.router.add_get("/", fleet.index)
    app.router.add_static("/static/", STATIC)
    app.router.add_get("/api/fleet", fleet.api_state)
    app.router.add_get("/api/fleet/events", fleet.events)
    app.router.add_post("/api/nodes/{node}/action", fleet.action)
    app.router.add_get("/nodes/{node}", fleet.redirect)
    app.router.add_route("*", "/nodes/{node}/{tail:.*}", fleet.proxy)
    app.router.add_post("/RPC2", rpc2)
    app.on_cleanup.append(close_executor)
    return app
