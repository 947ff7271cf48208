"""``/exec/{namespace}/{pod}/{container}``, ``/attach/{namespace}/{pod}/{container}``,
``/portForward/{namespace}/{pod}`` and ``/run/{namespace}/{pod}/{container}`` on the main port.

``/exec`` asks the runtime (CRI ``Exec``, embedded or containerd) for a streaming URL, then
- SPDY/3.1 (what the API server sends a kubelet for ``kubectl exec``): splices the upgraded
  connection to the runtime's URL byte for byte (``streamproxy``);
- WebSocket (``v5.channel.k8s.io``/``v4.channel.k8s.io``): relays it message by message,
  accepting the protocol the runtime chose.
``/attach`` and ``/portForward`` go the same two ways to CRI ``Attach`` (the container) and
``PortForward`` (the pod's ready sandbox; WebSocket clients name the ports with ``port``).
The streams are the kubelet's query parameters ``input``/``output``/``error``/``tty`` (``1``),
or ``stdin``/``stdout``/``stderr``; a TTY has no separate stderr (dropped, as the kubelet
does). ``/run`` is the kubelet's non-streaming exec: ``cmd`` (split on
white space, as the kubelet does) through ``ExecSync``; the body is stdout then stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from cri_api.v1 import api_pb2 as pb

from podvisor.common.labels import CONTAINER_NAME, POD_NAME, POD_NAMESPACE
from podvisor.services.cri import CriError, RuntimeClient
from podvisor.services.server.app import status_error
from podvisor.services.server.streamproxy import is_spdy, splice_to_runtime

__all__ = ["add_exec_routes"]

WS_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
RUN_TIMEOUT = 60.0
_TRUE = {"1", "true", "True", "TRUE"}


class ExecRequestError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason = code, reason


def _flag(query: Any, name: str) -> bool:
    return str(query.get(name, "")) in _TRUE


# the kubelet's query names (the API server sends these) and the CRI's
STREAM_PARAMS = {"stdin": ("input", "stdin"), "stdout": ("output", "stdout"),
                 "stderr": ("error", "stderr"), "tty": ("tty",)}


def stream_flags(query: Any) -> dict[str, bool]:
    flags = {s: any(_flag(query, n) for n in names) for s, names in STREAM_PARAMS.items()}
    if flags["tty"]:
        flags["stderr"] = False
    return flags


def find_container(client: RuntimeClient, ns: str, pod: str, container: str) -> str:
    """The running container's ID; ``ExecRequestError`` 404 when there is none."""
    selector = {POD_NAMESPACE: ns, POD_NAME: pod, CONTAINER_NAME: container}
    found = client.list_containers(pb.ContainerFilter(
        state=pb.ContainerStateValue(state=pb.CONTAINER_RUNNING), label_selector=selector))
    if not found:
        raise ExecRequestError(404, "NotFound",
                               f'container "{container}" of pod {ns}/{pod} is not running')
    return str(max(found, key=lambda c: c.created_at).id)


def add_exec_routes(app: web.Application, client: Callable[[], RuntimeClient],
                    log: Any) -> None:
    async def in_thread(fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn)

    async def exec_handler(request: web.Request) -> web.StreamResponse:
        ns, pod = request.match_info["namespace"], request.match_info["pod"]
        name = request.match_info["container"]
        q = request.query
        cmd = q.getall("command", [])
        streams = stream_flags(q)
        if not cmd:
            return status_error(400, "BadRequest", "exec: no command (the command query "
                                                   "parameter, repeated per argument)")
        if not (streams["stdin"] or streams["stdout"] or streams["stderr"]):
            return status_error(400, "BadRequest",
                                "exec: one of stdin, stdout or stderr must be true")
        upgrade = request.headers.get("Upgrade", "").lower()
        spdy = is_spdy(request)
        if upgrade != "websocket" and not spdy:
            return status_error(400, "BadRequest",
                                "exec needs an upgrade: SPDY/3.1 (X-Stream-Protocol-Version "
                                "v4.channel.k8s.io) or WebSocket with one of the protocols "
                                f"{', '.join(WS_PROTOCOLS)}")
        wanted = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "")
                  .split(",") if p.strip()]
        offered = [p for p in wanted if p in WS_PROTOCOLS]
        if not offered and not spdy:
            return status_error(400, "BadRequest", "exec: none of the WebSocket protocols "
                                f"{wanted} is supported; use one of {', '.join(WS_PROTOCOLS)}")
        try:
            cid = await in_thread(lambda: find_container(client(), ns, pod, name))
            url = await in_thread(lambda: client().exec(pb.ExecRequest(
                container_id=cid, cmd=cmd, **streams)))
        except ExecRequestError as exc:
            return status_error(exc.code, exc.reason, str(exc))
        except CriError as exc:
            return status_error(400 if exc.code.name in ("INVALID_ARGUMENT",
                                                         "FAILED_PRECONDITION") else 503,
                                "BadRequest" if exc.code.name != "UNAVAILABLE"
                                else "ServiceUnavailable", f"exec: {exc}")
        log.info("mainport.exec", pod=f"{ns}/{pod}", container=name, cmd=cmd[:1],
                 protocol="SPDY/3.1" if spdy else "websocket", tty=streams["tty"])
        if spdy:
            return await splice_to_runtime(request, url, log, pod=f"{ns}/{pod}",
                                           container=name)
        return await relay_websocket(request, url, offered)

    async def run_handler(request: web.Request) -> web.StreamResponse:
        ns, pod = request.match_info["namespace"], request.match_info["pod"]
        name = request.match_info["container"]
        cmd = request.query.get("cmd", "").split()
        if not cmd:
            return status_error(400, "BadRequest", "run: no command (the cmd query parameter)")
        try:
            cid = await in_thread(lambda: find_container(client(), ns, pod, name))
            resp = await in_thread(lambda: client().exec_sync(cid, cmd, RUN_TIMEOUT))
        except ExecRequestError as exc:
            return status_error(exc.code, exc.reason, str(exc))
        except CriError as exc:
            return status_error(400, "BadRequest", f"run: {exc}")
        log.info("mainport.run", pod=f"{ns}/{pod}", container=name, cmd=cmd[:1],
                 exit_code=resp.exit_code)
        return web.Response(body=resp.stdout + resp.stderr,
                            content_type="text/plain")

    async def attach_handler(request: web.Request) -> web.StreamResponse:
        ns, pod = request.match_info["namespace"], request.match_info["pod"]
        name = request.match_info["container"]
        streams = stream_flags(request.query)
        if not (streams["stdin"] or streams["stdout"] or streams["stderr"]):
            return status_error(400, "BadRequest",
                                "attach: one of stdin, stdout or stderr must be true")
        spdy = is_spdy(request)
        wanted = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "")
                  .split(",") if p.strip()]
        offered = [p for p in wanted if p in WS_PROTOCOLS]
        if not spdy and (request.headers.get("Upgrade", "").lower() != "websocket"
                         or not offered):
            return status_error(400, "BadRequest",
                                "attach needs an upgrade: SPDY/3.1 (X-Stream-Protocol-Version "
                                "v4.channel.k8s.io) or WebSocket with one of the protocols "
                                f"{', '.join(WS_PROTOCOLS)}")
        try:
            cid = await in_thread(lambda: find_container(client(), ns, pod, name))
            url = await in_thread(lambda: client().attach(pb.AttachRequest(
                container_id=cid, **streams)))
        except ExecRequestError as exc:
            return status_error(exc.code, exc.reason, str(exc))
        except CriError as exc:
            return _cri_refusal("attach", exc)
        log.info("mainport.attach", pod=f"{ns}/{pod}", container=name,
                 protocol="SPDY/3.1" if spdy else "websocket")
        if spdy:
            return await splice_to_runtime(request, url, log, pod=f"{ns}/{pod}",
                                           container=name)
        return await relay_websocket(request, url, offered)

    async def port_forward_handler(request: web.Request) -> web.StreamResponse:
        ns, pod = request.match_info["namespace"], request.match_info["pod"]
        try:
            ports = [int(p) for p in request.query.getall("port", [])]
        except ValueError:
            return status_error(400, "BadRequest", "portForward: a port must be a number")
        spdy = is_spdy(request)
        wanted = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "")
                  .split(",") if p.strip()]
        if request.headers.get("Upgrade", "").lower() != "websocket" and not spdy:
            return status_error(400, "BadRequest",
                                "portForward needs an upgrade: SPDY/3.1 "
                                "(X-Stream-Protocol-Version portforward.k8s.io) or WebSocket "
                                "(the port query parameter)")
        if not spdy and not ports:
            return status_error(400, "BadRequest", "portForward over WebSocket: a port is "
                                                   "needed (the port query parameter)")
        try:
            sid = await in_thread(lambda: find_sandbox(client(), ns, pod))
            url = await in_thread(lambda: client().port_forward(pb.PortForwardRequest(
                pod_sandbox_id=sid, port=ports)))
        except ExecRequestError as exc:
            return status_error(exc.code, exc.reason, str(exc))
        except CriError as exc:
            return _cri_refusal("portForward", exc)
        log.info("mainport.port_forward", pod=f"{ns}/{pod}", ports=ports,
                 protocol="SPDY/3.1" if spdy else "websocket")
        if spdy:
            return await splice_to_runtime(request, url, log, pod=f"{ns}/{pod}")
        return await relay_websocket(request, url, wanted or [""])

    for method in ("GET", "POST"):
        app.router.add_route(method, "/exec/{namespace}/{pod}/{container}", exec_handler)
        app.router.add_route(method, "/attach/{namespace}/{pod}/{container}", attach_handler)
        app.router.add_route(method, "/portForward/{namespace}/{pod}", port_forward_handler)
    app.router.add_post("/run/{namespace}/{pod}/{container}", run_handler)


def _cri_refusal(what: str, exc: CriError) -> web.Response:
    if exc.code.name == "NOT_FOUND":
        return status_error(404, "NotFound", f"{what}: {exc}")
    if exc.code.name == "UNAVAILABLE":
        return status_error(503, "ServiceUnavailable", f"{what}: {exc}")
    return status_error(400, "BadRequest", f"{what}: {exc}")


def find_sandbox(client: RuntimeClient, ns: str, pod: str) -> str:
    """The pod's ready sandbox's ID; ``ExecRequestError`` 404 when there is none."""
    found = client.list_pod_sandbox(pb.PodSandboxFilter(
        state=pb.PodSandboxStateValue(state=pb.SANDBOX_READY),
        label_selector={POD_NAMESPACE: ns, POD_NAME: pod}))
    if not found:
        raise ExecRequestError(404, "NotFound", f"pod {ns}/{pod} has no ready sandbox")
    return str(max(found, key=lambda s: s.created_at).id)


async def relay_websocket(request: web.Request, url: str,
                          offered: list[str]) -> web.StreamResponse:
    """Open the runtime's URL as a WebSocket with the client's protocols and relay messages
    both ways; the client gets the protocol the runtime chose."""
    ws_url = "ws" + url[len("http"):] if url.startswith("http") else url
    parts = urlsplit(url)
    protocols = [p for p in offered if p]
    async with aiohttp.ClientSession() as session:
        try:
            # containerd's server (golang.org/x/net/websocket) wants an Origin header
            upstream = await session.ws_connect(ws_url, protocols=protocols, max_msg_size=0,
                                                headers={"Origin": f"{parts.scheme}://"
                                                                   f"{parts.netloc}"})
        except aiohttp.ClientError as exc:
            return status_error(502, "BadGateway",
                                f"the runtime's streaming server refused: {exc}")
        async with upstream:
            chosen = upstream.protocol or (protocols[0] if protocols else "")
            down = web.WebSocketResponse(protocols=(chosen,) if chosen else (),
                                         max_msg_size=0)
            await down.prepare(request)
            await _relay(down, upstream)
    return down


async def _relay(down: web.WebSocketResponse,
                 up: aiohttp.ClientWebSocketResponse) -> None:
    """Copy messages both ways until either side closes, then close the other."""
    async def pump(src: Any, dst: Any) -> None:
        async for msg in src:
            if msg.type is aiohttp.WSMsgType.BINARY:
                await dst.send_bytes(msg.data)
            elif msg.type is aiohttp.WSMsgType.TEXT:
                await dst.send_str(msg.data)
            else:
                break

    tasks = [asyncio.ensure_future(pump(up, down)), asyncio.ensure_future(pump(down, up))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await t
        with contextlib.suppress(ConnectionError):
            await down.close()
            await up.close()
