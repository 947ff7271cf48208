"""The main port's upgrade-aware proxy to the runtime's streaming URL (exec, attach,
port-forward over SPDY/3.1), as the kubelet's ``proxy.UpgradeAwareHandler``: the client's
upgrade request goes to the runtime's URL (embedded or containerd) with the client's
``Upgrade``/``X-Stream-Protocol-Version`` headers and without its credentials; the runtime's
answer comes back as it is (a refusal with its status and text); after a 101 the two
connections are spliced byte for byte until either ends."""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from podvisor.common.upgrade import UpgradeError, connect_upgrade, finish_hijacked, hijack, splice
from podvisor.services.server.app import status_error

__all__ = ["is_spdy", "splice_to_runtime"]

FORWARDED = ("Upgrade", "Connection", "X-Stream-Protocol-Version")


def is_spdy(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower().startswith("spdy/")


async def splice_to_runtime(request: web.Request, url: str, log: Any,
                            **log_fields: Any) -> web.StreamResponse:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return status_error(502, "BadGateway", f"the runtime's streaming URL {url!r} is not "
                                               "HTTP(S)")
    headers = [(name, value) for name in FORWARDED
               for value in request.headers.getall(name, [])]
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        status, reason, got, body, reader, writer = await connect_upgrade(
            url, request.method, path, headers)
    except (OSError, UpgradeError) as exc:
        return status_error(502, "BadGateway",
                            f"the runtime's streaming server did not answer: {exc}")
    if status != 101:
        text = body.decode(errors="replace").strip()
        return status_error(status, reason.replace(" ", "") or "BadRequest",
                            text or f"the runtime refused the upgrade ({status} {reason})")
    try:
        client = await hijack(request, got)
    except ConnectionError:
        writer.close()
        return finish_hijacked()
    log.info("mainport.stream_upgraded", protocol=next(
        (v for k, v in got if k.lower() == "x-stream-protocol-version"), ""), **log_fields)
    with contextlib.suppress(ConnectionError, OSError):
        await splice(client, (reader, writer))
    return finish_hijacked()
