"""The dashboard's faults (issue 28), on the ops port behind its HTTP Basic auth:

- ``GET /api/faults``: ``{"faults": [fault in force]}`` (the control command ``fault-list``);
- ``POST /api/faults`` with the ``fault-inject`` request's args (``{"kind", "target", ...,
  "for"?}``, ``ipc/faults.py``): the fault in force, or 409 ``{"faultCode", "faultString"}``
  (a bad request, an unknown process);
- ``POST /api/faults/clear`` ``{"id"?}``: ``{"cleared": [...]}`` (no id: every fault).

The page's panel (``static/faults.js``) lists the faults in force with their ends, injects one
from a small form and clears one or all. Every call goes to the supervisor's control endpoint,
as ``podvisorctl fault`` does, so the events record the dashboard's faults like any other.
"""

from __future__ import annotations

import asyncio
import xmlrpc.client
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from aiohttp import web

__all__ = ["add_faults_api"]

Control = Callable[..., Any]  # OpsRpc._control: (command, **args) -> result, faults as XML-RPC's


class FaultsApi:
    def __init__(self, control: Control, executor: Executor) -> None:
        self._control = control
        self._executor = executor

    async def _call(self, command: str, args: dict[str, Any]) -> web.Response:
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(self._executor,
                                                lambda: self._control(command, **args))
        except xmlrpc.client.Fault as fault:
            return web.json_response({"faultCode": fault.faultCode,
                                      "faultString": fault.faultString}, status=409)
        return web.json_response(result)

    async def list(self, request: web.Request) -> web.Response:
        return await self._call("fault-list", {})

    async def inject(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return web.json_response({"faultString": "need a JSON object: the fault"},
                                     status=400)
        return await self._call("fault-inject", body)

    async def clear(self, request: web.Request) -> web.Response:
        try:
            body = await request.json() if request.can_read_body else {}
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("id", ""), str):
            return web.json_response({"faultString": "need JSON {id?}"}, status=400)
        return await self._call("fault-clear", {"id": body["id"]} if body.get("id") else {})


def add_faults_api(app: web.Application, control: Control, executor: Executor) -> None:
    api = FaultsApi(control, executor)
    app.router.add_get("/api/faults", api.list)
    app.router.add_post("/api/faults", api.inject)
    app.router.add_post("/api/faults/clear", api.clear)
