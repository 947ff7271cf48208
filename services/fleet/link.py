"""One node as the fleet sees it: a subscriber of the node's own live feed.

``NodeLink.run`` keeps one ``GET <node>/api/events?beat=2`` open with the node's credentials
(the dashboard's server-sent events: ``state`` when something changed, ``usage`` every sample,
a comment line after 2 quiet seconds). So the fleet costs a node what one idle page costs
it, and learns of a change as its own page does. The node is **up** from the first event,
**down** at once when the connection fails or ends (a stopped or killed agent closes it) and
when nothing arrives for ``timeout`` (5 s: a hung node; connecting is bounded by the same
5 s), then asked again every ``retry`` (1 s). Nothing waits on a node: the page and the
XML-RPC calls read the last ``NodeView``.

``on_change()`` is called (event loop thread) whenever the view changed. Actions go through
``post`` (the node's ``/api/action``) and ``proxy_url``/``auth`` (the fleet's reverse proxy).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from podvisor.ipc.clock import Clock
from podvisor.services.fleet.config import NodeSpec

__all__ = ["BEAT", "NodeLink", "NodeView"]

BEAT = 2.0  # the node writes a comment line after this long without an event
TIMEOUT = 5.0  # connect, and silence on an open feed, before the node counts as down
RETRY = 1.0
ACTION_TIMEOUT = 75.0  # a start waits up to 60 s on the node


@dataclass(frozen=True)
class NodeView:
    """What the fleet knows of a node (immutable; replaced whole)."""

    name: str
    url: str
    up: bool = False
    error: str = "connecting"
    since: float = 0.0  # wall seconds of the last up/down flip
    state: dict[str, Any] | None = None  # the node page's last ``state`` event
    pressure: tuple[dict[str, Any], ...] = ()
    usage: dict[str, list[int]] = field(default_factory=dict)  # subsystems' and pods' last


class NodeLink:
    def __init__(self, spec: NodeSpec, session: aiohttp.ClientSession, clock: Clock,
                 on_change: Callable[[], object], timeout: float = TIMEOUT,
                 retry: float = RETRY) -> None:
        self.spec, self.session, self.clock, self.on_change = spec, session, clock, on_change
        self.timeout, self.retry = timeout, retry
        self.view = NodeView(spec.name, spec.url, since=clock.wall())
        self.auth = aiohttp.BasicAuth(spec.username, spec.password)
        self.ssl: ssl.SSLContext | bool = True
        if spec.ca_file:
            self.ssl = ssl.create_default_context(cafile=spec.ca_file)
        self._task: asyncio.Task[None] | None = None

    def _set(self, **changes: Any) -> None:
        view = self.view
        if "up" in changes and changes["up"] != view.up:
            changes["since"] = self.clock.wall()
        new = replace(view, **changes)
        if new != view:
            self.view = new
            self.on_change()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def run(self) -> None:
        while True:
            try:
                await self._follow()
                why = "the node closed its feed"
            except aiohttp.ClientResponseError as err:
                why = "wrong credentials" if err.status == 401 else f"HTTP {err.status}"
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as err:
                why = _why(err, self.timeout)
            self._set(up=False, error=why)
            await asyncio.sleep(self.retry)

    async def _follow(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout,
                                        sock_read=self.timeout)
        async with self.session.get(f"{self.spec.url}/api/events", params={"beat": str(BEAT)},
                                    auth=self.auth, timeout=timeout, ssl=self.ssl,
                                    raise_for_status=True) as resp:
            event, data = "", []
            while True:
                line = await resp.content.readline()
                if not line:
                    return
                text = line.decode("utf-8", "replace").rstrip("\r\n")
                if text.startswith(":"):
                    self._set(up=True, error="")
                elif text.startswith("event:"):
                    event = text[6:].strip()
                elif text.startswith("data:"):
                    data.append(text[5:].lstrip())
                elif not text and event:
                    self._event(event, "\n".join(data))
                    event, data = "", []

    def _event(self, event: str, data: str) -> None:
        if event == "state":
            self._set(up=True, error="", state=json.loads(data))
        elif event == "usage":
            d = json.loads(data)
            usage = {k: v for k, v in (d.get("v") or {}).items()
                     if k.startswith("agent:") or ":" not in k}
            self._set(up=True, error="", pressure=tuple(d.get("pressure") or ()), usage=usage)
        else:
            self._set(up=True, error="")

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """POST JSON to the node with its credentials: (HTTP status, JSON answer)."""
        timeout = aiohttp.ClientTimeout(total=ACTION_TIMEOUT, sock_connect=self.timeout)
        try:
            async with self.session.post(f"{self.spec.url}{path}", json=body, auth=self.auth,
                                         timeout=timeout, ssl=self.ssl) as resp:
                try:
                    return resp.status, await resp.json(content_type=None)
                except ValueError:
                    return resp.status, {"faultString": f"HTTP {resp.status} from the node"}
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            return 502, {"faultString": f"node {self.spec.name}: {_why(err, self.timeout)}"}


def _why(err: BaseException, timeout: float) -> str:
    if isinstance(err, TimeoutError | aiohttp.ServerTimeoutError):
        return f"no answer within {timeout:g}s"
    return str(err) or type(err).__name__
