"""The server's two ports, started on the web thread (``common.web.WebService``): the
read-only HTTP port (kubelet ``readOnlyPort``) and the main HTTPS port (kubelet ``port``) on
``address``. Both read the one ``View`` the service loop publishes (``web.view``,
``web.refresh``). ``readOnlyPort: 0`` / ``port: 0`` disable a port.

The main port does not take the process down when it cannot start (its address in use, an
unreadable certificate, a malformed token file): the error is logged (``mainport.failed``, with
the reason) and the start is retried every ``MAIN_RETRY`` seconds, so the read-only port and
``/healthz`` keep serving and fixing the file heals the port without a restart.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from typing import Any

import zmq

from podvisor.common.child import ChildContext
from podvisor.common.config import config_to_mapping
from podvisor.common.endpoint import cri_endpoint
from podvisor.common.web import WebService
from podvisor.ipc.control import ControlClient, ControlError, ProcessRow
from podvisor.services.certificates import serving_pair_path
from podvisor.services.cri import RuntimeClient, new_runtime_client
from podvisor.services.server.app import make_app
from podvisor.services.server.auth import AuthConfigError, build_auth
from podvisor.services.server.dyntls import DynamicServing
from podvisor.services.server.mainport import make_main_app
from podvisor.services.server.replicas import View
from podvisor.services.server.tls import TlsError, serving_context, serving_pair

__all__ = ["MAIN_RETRY", "Ports"]

MAIN_RETRY = 5.0
STATS_TIMEOUT = 10.0  # ListContainerStats for /stats/summary
SHUTDOWN_TIMEOUT = 2.0  # open connections (a followed log) get this long at stop
PROCESSES_TIMEOUT = 1.0  # the supervisor's `status`, for /metrics


def process_rows(control: ControlClient) -> Callable[[], list[ProcessRow] | None]:
    """The supervised processes for ``/metrics``: one ``status`` call at scrape time (on a worker
    thread, a socket of its own), so the figures are the supervisor's own, never a copy that a
    restarted server would have to rebuild. None when the agent does not answer (it is
    stopping): the scrape then leaves the process metrics out."""
    def rows() -> list[ProcessRow] | None:
        try:
            return control.processes()
        except (ControlError, zmq.ZMQError):
            return None
    return rows


class Ports:
    """``await Ports(ctx)(web)``: the web service's ``serve``."""

    def __init__(self, ctx: ChildContext) -> None:
        self.ctx = ctx

    async def __call__(self, web: WebService[Any]) -> None:
        if self.ctx.config.read_only_port:
            await self._start_read_only(web)
        if self.ctx.config.port:
            web.spawn(self._try_main(web))

    async def _start_read_only(self, web: WebService[View]) -> None:
        ctx = self.ctx
        app = make_app(lambda: web.view, clock=ctx.clock.monotonic, wall=ctx.clock.wall,
                       refresh=web.refresh)
        address = ctx.config.address or "127.0.0.1"
        await web.site(app, address, ctx.config.read_only_port,
                       shutdown_timeout=SHUTDOWN_TIMEOUT)
        ctx.log.info("server.listening", address=address, port=ctx.config.read_only_port)

    async def _try_main(self, web: WebService[View]) -> None:
        try:
            await self._start_main(web)
        except (TlsError, AuthConfigError, OSError) as exc:
            self.ctx.log.error("mainport.failed", port=self.ctx.config.port, error=str(exc),
                               retry_in=MAIN_RETRY)
            if not web.stopping():
                web.later(MAIN_RETRY, lambda: web.spawn(self._try_main(web)))

    async def _start_main(self, web: WebService[View]) -> None:
        """Raises ``TlsError``, ``AuthConfigError`` or ``OSError`` (bind) with a clear message."""
        ctx = self.ctx
        cfg = ctx.config
        authn_cfg = cfg.authentication
        # on a thread: a webhook mode imports the kubernetes client (~0.7 s) and reads kubeconfig
        authn, authz = await asyncio.to_thread(build_auth, cfg, ctx.clock.monotonic)
        if cfg.server_tls_bootstrap:  # [issue 26] the pair the API server signs, rotated
            fallback = serving_context(serving_pair(
                cfg.root_dir, cfg.tls_cert_file, cfg.tls_private_key_file, cfg.node_name,
                cfg.address, datetime.datetime.now(datetime.UTC)), authn_cfg.client_ca_file) \
                if cfg.tls_cert_file else None
            ssl_ctx = DynamicServing(serving_pair_path(cfg), authn_cfg.client_ca_file,
                                     fallback, ctx.log).context
        else:
            now = datetime.datetime.fromtimestamp(ctx.clock.wall(), datetime.UTC)  # the cert's
            pair = serving_pair(cfg.root_dir, cfg.tls_cert_file, cfg.tls_private_key_file,
                                cfg.node_name, cfg.address, now)
            if pair.generated:
                ctx.log.info("mainport.certificate_generated", cert=str(pair.cert),
                             key=str(pair.key))
            ssl_ctx = serving_context(pair, authn_cfg.client_ca_file)
        clients: list[RuntimeClient] = []

        def client() -> RuntimeClient:
            """The runtime's CRI client, made on first use (``/stats/summary``)."""
            if not clients:
                endpoint = cri_endpoint(cfg.runtime_endpoint, ctx.paths.cri_socket, cfg.cri_proxy)
                clients.append(new_runtime_client(endpoint, timeout=STATS_TIMEOUT))
            return clients[0]

        app = make_main_app(lambda: web.view, refresh=web.refresh,
                            authn=authn, authz=authz, node_name=cfg.node_name,
                            root_dir=cfg.root_dir,
                            config=config_to_mapping(cfg), log=ctx.log,
                            stopping=web.stopping, clock=ctx.clock.monotonic,
                            wall=ctx.clock.wall,
                            processes=process_rows(ControlClient(
                                ctx.paths.control, PROCESSES_TIMEOUT, ctx.zctx)),
                            container_stats=lambda: client().list_container_stats(),
                            image_fs_info=lambda: client().image_fs_info(),
                            runtime=client)
        address = cfg.address or "127.0.0.1"
        await web.site(app, address, cfg.port, ssl_context=ssl_ctx,
                       shutdown_timeout=SHUTDOWN_TIMEOUT)
        ctx.log.info("mainport.listening", address=address, port=cfg.port,
                     tokens=authn.token_count, client_ca=bool(authn_cfg.client_ca_file),
                     anonymous=authn_cfg.anonymous_enabled, webhook=authn_cfg.webhook_enabled,
                     authorization=cfg.authorization.mode)
