"""The aiohttp application of the read-only port: ``/healthz``, ``/pods``, ``/runningpods/``.

Handlers read an immutable ``View`` through ``get_view()`` (never zmq). Errors are Kubernetes
``Status`` JSON objects with a 4xx code: unknown path 404, wrong method 405, unexpected query
parameters 400; 503 until the replicas have their first snapshot (so a
restarted server never serves an empty PodList).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from podvisor.common.podlist import PodListJson, check_health, running_pods
from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.services.server.replicas import View

Clock = Callable[[], float]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def status_error(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}
    return web.json_response(body, status=code)


def _json(obj: Any) -> web.Response:
    return web.Response(text=json.dumps(obj, separators=(",", ":")),
                        content_type="application/json")


READ_ONLY_HINT = "the read-only port serves /healthz, /pods and /runningpods/"


def error_middleware(hint: str) -> Any:
    @web.middleware
    async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPMethodNotAllowed:
            return status_error(405, "MethodNotAllowed",
                                f"method {request.method} not allowed on {request.path}; "
                                "use GET")
        except web.HTTPNotFound:
            return status_error(404, "NotFound", f"no such endpoint {request.path}; {hint}")
    return _errors


def make_app(get_view: Callable[[], View], clock: Clock = SYSTEM_CLOCK.monotonic,
             wall: Clock = SYSTEM_CLOCK.wall,
             refresh: Callable[[], Awaitable[View]] | None = None,
             middlewares: tuple[Any, ...] = (),
             hint: str = READ_ONLY_HINT) -> web.Application:
    """``refresh``: a fresh view (the replica pump drains what is queued); else ``get_view``.
    ``middlewares`` run inside the error handler (the main port's authentication); the main
    port adds its own routes to the returned application."""
    pod_json = PodListJson()  # handlers run on the event loop thread only

    async def current() -> View:
        return get_view() if refresh is None else await refresh()

    def no_query(request: web.Request) -> web.Response | None:
        if request.query:
            names = ", ".join(sorted(request.query))
            return status_error(400, "BadRequest", f"unexpected query parameters: {names}")
        return None

    async def healthz(request: web.Request) -> web.Response:
        view = await current()
        age = None if view.desired_heard is None else clock() - view.desired_heard
        health = check_health(view.pleg.get("_health"), wall(), view.desired_synced, age,
                              view.desired.get("_runtime"))
        return web.Response(text=health.text(), status=200 if health.ok else 500)

    async def pods(request: web.Request) -> web.Response:
        bad = no_query(request)
        if bad is not None:
            return bad
        view = await current()
        if not (view.desired_synced and view.statuses_synced):
            return status_error(503, "ServiceUnavailable",
                                "not synced yet with the sync loop's and status's maps; retry")
        return web.Response(body=pod_json.render(view.desired, view.statuses),
                            content_type="application/json", charset="utf-8")

    async def runningpods(request: web.Request) -> web.Response:
        bad = no_query(request)
        if bad is not None:
            return bad
        view = await current()
        if not view.pleg_synced:
            return status_error(503, "ServiceUnavailable", "not synced yet with PLEG; retry")
        return _json(running_pods(view.pleg))

    app = web.Application(middlewares=[error_middleware(hint), *middlewares])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/pods", pods)
    app.router.add_get("/runningpods/", runningpods)
    app.router.add_get("/runningpods", runningpods)
    return app
