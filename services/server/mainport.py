"""The main port's application (kubelet ``port``, 10250): HTTPS, authenticated, authorized.

It serves what the read-only port serves (``/healthz``, ``/pods``, ``/runningpods/``) plus
``/containerLogs/{namespace}/{pod}/{container}``, ``/configz``, ``/stats/summary``,
``/metrics``, ``/metrics/probes`` and ``/metrics/resource``. Every request, whatever its path
(an unknown one included), is authenticated first (401 without valid credentials), then
authorized (403 when not allowed), before anything else; errors are Kubernetes ``Status``
objects, never a 500 for a client's mistake.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import grpc
import psutil
from aiohttp import web
from cri_api.v1 import api_pb2 as pb

from podvisor.ipc.control import ProcessRow
from podvisor.services.cri import CriError, RuntimeClient
from podvisor.services.server.app import Clock, Handler, make_app, status_error
from podvisor.services.server.auth import (
    Authenticator,
    Authorizer,
    attributes,
    authenticate_async,
    authorize_async,
)
from podvisor.services.server.containerlogs import (
    LogRequestError,
    find_container_files,
    parse_options,
    serve_logs,
)
from podvisor.services.server.execproxy import add_exec_routes
from podvisor.services.server.metrics import (
    CONTENT_TYPE,
    render_metrics,
    render_probe_metrics,
    render_resource_metrics,
)
from podvisor.services.server.replicas import View
from podvisor.services.server.summarymaker import SummaryMaker

__all__ = ["MAIN_HINT", "REDACTED", "make_main_app", "redact_config"]

MAIN_HINT = ("the main port serves /healthz, /pods, /runningpods/, "
             "/containerLogs/{namespace}/{pod}/{container}, /configz, /stats/summary, /metrics, "
             "/metrics/probes, /metrics/resource, /exec/{namespace}/{pod}/{container}, "
             "/attach/{namespace}/{pod}/{container}, /portForward/{namespace}/{pod} (SPDY/3.1 "
             "or WebSocket) and /run/{namespace}/{pod}/{container}")
REDACTED = "<redacted>"


def redact_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The effective config with secret values replaced: the static pod URL's header values
    (they may carry credentials). Paths to secret files are not secrets and are kept."""
    out = dict(config)
    headers = out.get("staticPodURLHeader")
    if isinstance(headers, Mapping) and headers:
        out["staticPodURLHeader"] = {name: [REDACTED] for name in headers}
    return out


def auth_middleware(authn: Authenticator, authz: Authorizer, node_name: str,
                    log: Any) -> Any:
    @web.middleware
    async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        peercert = request.transport.get_extra_info("peercert") if request.transport else None
        user, why = await authenticate_async(authn, request.headers.get("Authorization"),
                                             peercert)
        if user is None:
            log.info("mainport.unauthorized", path=request.path, reason=why)
            response = status_error(401, "Unauthorized", f"Unauthorized: {why}")
            response.headers["WWW-Authenticate"] = 'Bearer realm="podvisor"'
            return response
        attrs = attributes(request.method, request.path, node_name)
        allowed, reason = await authorize_async(authz, user, attrs)
        if not allowed:
            log.info("mainport.forbidden", path=request.path, user=user.name,
                     verb=attrs.verb, subresource=attrs.subresource)
            return status_error(403, "Forbidden",
                                f"Forbidden (user={user.name}, verb={attrs.verb}, "
                                f"resource={attrs.resource}, subresource={attrs.subresource})"
                                + (f": {reason}" if reason else ""))
        return await handler(request)
    return _auth


T = TypeVar("T")


def _no_runtime() -> list[pb.ContainerStats]:
    raise CriError("ListContainerStats", grpc.StatusCode.UNAVAILABLE,
                   "no runtime to ask for stats")


def make_main_app(get_view: Callable[[], View], *, authn: Authenticator, authz: Authorizer,
                  node_name: str, root_dir: str, config: Mapping[str, Any], log: Any,
                  stopping: Callable[[], bool],
                  processes: Callable[[], list[ProcessRow] | None] = lambda: None,
                  container_stats: Callable[[], list[pb.ContainerStats]] | None = None,
                  image_fs_info: Callable[[], pb.ImageFsInfoResponse] | None = None,
                  clock: Clock = time.monotonic,
                  wall: Clock = time.time,
                  refresh: Callable[[], Awaitable[View]] | None = None,
                  runtime: Callable[[], RuntimeClient] | None = None) -> web.Application:
    app = make_app(get_view, clock=clock, wall=wall, refresh=refresh,
                   middlewares=(auth_middleware(authn, authz, node_name, log),),
                   hint=MAIN_HINT)
    pod_logs = Path(root_dir) / "pod-logs"
    metrics_dir = str(Path(root_dir) / "run" / "metrics")
    configz = {"kubeletconfig": redact_config(config)}

    async def current() -> View:
        return get_view() if refresh is None else await refresh()

    async def container_logs(request: web.Request) -> web.StreamResponse:
        ns, pod = request.match_info["namespace"], request.match_info["pod"]
        container = request.match_info["container"]
        try:
            opts = parse_options(request.query, wall())
            view = await current()
            files = find_container_files(pod_logs, ns, pod, container,
                                         lambda: set(view.desired))
            log.debug("mainport.logs", pod=f"{ns}/{pod}", container=container,
                      follow=opts.follow)
            return await serve_logs(request, files, opts, stopping)
        except LogRequestError as exc:
            return status_error(exc.code, exc.reason, str(exc))

    async def configz_handler(request: web.Request) -> web.Response:
        return web.json_response(configz)

    app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", container_logs)
    async def metrics(request: web.Request) -> web.Response:
        view = await current()
        if not view.pleg_synced:
            return status_error(503, "ServiceUnavailable", "not synced yet with PLEG; retry")
        rows = await asyncio.get_running_loop().run_in_executor(None, processes)
        body = render_metrics(view, rows, metrics_dir)
        return web.Response(body=body,
                            headers={"Content-Type": CONTENT_TYPE})

    app.router.add_get("/configz", configz_handler)
    async def probe_metrics(request: web.Request) -> web.Response:
        body = await asyncio.get_running_loop().run_in_executor(
            None, render_probe_metrics, metrics_dir)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    maker = SummaryMaker(node_name, int(psutil.boot_time() * 1e9), root_dir, str(pod_logs),
                         container_stats or _no_runtime, image_fs_info, wall)

    async def make_summary(encode: Callable[[Mapping[str, Any]], tuple[T, str | None]]) -> T:
        """Raises ``CriError`` when the runtime does not answer. One executor job: the CRI
        calls, the node's and the logs' figures, the assembly (and the JSON text)."""
        view = await current()
        body, why = await asyncio.get_running_loop().run_in_executor(None, encode, view.pleg)
        if why is not None:
            log.warning("mainport.image_fs_info_failed", error=why)
        return body

    async def stats_summary(request: web.Request) -> web.Response:
        if request.query and set(request.query) != {"only_cpu_and_memory"}:
            return status_error(400, "BadRequest", "unexpected query parameters: "
                                + ", ".join(sorted(request.query)))
        try:
            text = await make_summary(maker.make_json)
        except CriError as exc:
            return status_error(503, "ServiceUnavailable",
                                f"the runtime did not answer ListContainerStats: {exc}")
        return web.Response(body=text, content_type="application/json", charset="utf-8")

    async def resource_metrics(request: web.Request) -> web.Response:
        try:
            body: dict[str, Any] | None = await make_summary(maker.make)
        except CriError as exc:
            log.warning("mainport.resource_metrics_failed", error=str(exc))
            body = None
        return web.Response(body=render_resource_metrics(body),
                            headers={"Content-Type": CONTENT_TYPE})

    app.router.add_get("/stats/summary", stats_summary)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/metrics/probes", probe_metrics)
    app.router.add_get("/metrics/resource", resource_metrics)
    if runtime is not None:
        add_exec_routes(app, runtime, log)
    return app
