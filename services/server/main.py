"""The server process: the read-only HTTP port (kubelet ``readOnlyPort``) and the main HTTPS
port (kubelet ``port``) on ``address``.

Threads: the main thread runs the asyncio loop (aiohttp, and a timer that heartbeats and watches
``ctx.stop`` and the pump thread); one ``ReplicaPump`` thread owns every zmq socket. If the pump
thread dies the process exits with an error so the supervisor restarts it. Both ports share the
one set of replicas. ``readOnlyPort: 0`` / ``port: 0`` disable a port; with both off the process
only heartbeats until it is stopped.

The main port does not take the process down when it cannot start (its address in use, an
unreadable certificate, a malformed token file): the error is logged (``mainport.failed``, with
the reason) and the start is retried every ``MAIN_RETRY`` seconds, so the read-only port and
``/healthz`` keep serving and fixing the file heals the port without a restart.
"""

from __future__ import annotations

import asyncio
import datetime

from aiohttp import web

from podvisor.common.child import ChildContext
from podvisor.common.config import config_to_mapping
from podvisor.common.endpoint import cri_endpoint
from podvisor.services.cri import RuntimeClient, new_runtime_client
from podvisor.services.server.app import make_app
from podvisor.services.server.auth import AuthConfigError, build_auth
from podvisor.services.server.mainport import make_main_app
from podvisor.services.server.processes import process_rows
from podvisor.services.server.replicas import ReplicaPump
from podvisor.services.server.tls import TlsError, serving_context, serving_pair

MAIN_RETRY = 5.0
STATS_TIMEOUT = 10.0  # ListContainerStats for /stats/summary
SHUTDOWN_TIMEOUT = 2.0  # open connections (a followed log) get this long at stop


class PumpDied(RuntimeError):
    pass


async def _start_read_only(ctx: ChildContext, pump: ReplicaPump) -> web.AppRunner:
    app = make_app(lambda: pump.view, clock=ctx.clock.monotonic, wall=ctx.clock.wall,
                   refresh=pump.refresh)
    runner = web.AppRunner(app, access_log=None, handle_signals=False,
                           shutdown_timeout=SHUTDOWN_TIMEOUT)
    await runner.setup()
    address = ctx.config.address or "127.0.0.1"
    site = web.TCPSite(runner, address, ctx.config.read_only_port, reuse_address=True)
    await site.start()
    ctx.log.info("server.listening", address=address, port=ctx.config.read_only_port)
    return runner


async def _start_main(ctx: ChildContext, pump: ReplicaPump,
                      stopping: asyncio.Event) -> web.AppRunner:
    """Raises ``TlsError``, ``AuthConfigError`` or ``OSError`` (bind) with a clear message."""
    cfg = ctx.config
    authn_cfg = cfg.authentication
    # on a thread: a webhook mode imports the kubernetes client (~0.7 s) and reads kubeconfig
    authn, authz = await asyncio.to_thread(build_auth, cfg, ctx.clock.monotonic)
    now = datetime.datetime.fromtimestamp(ctx.clock.wall(), datetime.UTC)  # the certificate's
    pair = serving_pair(cfg.root_dir, cfg.tls_cert_file, cfg.tls_private_key_file,
                        cfg.node_name, cfg.address, now)
    if pair.generated:
        ctx.log.info("mainport.certificate_generated", cert=str(pair.cert), key=str(pair.key))
    ssl_ctx = serving_context(pair, authn_cfg.client_ca_file)
    clients: list[RuntimeClient] = []

    def client() -> RuntimeClient:
        """The runtime's CRI client, made on first use (``/stats/summary``)."""
        if not clients:
            endpoint = cri_endpoint(cfg.runtime_endpoint, ctx.paths.cri_socket)
            clients.append(new_runtime_client(endpoint, timeout=STATS_TIMEOUT))
        return clients[0]

    app = make_main_app(lambda: pump.view, refresh=pump.refresh,
                        authn=authn, authz=authz, node_name=cfg.node_name, root_dir=cfg.root_dir,
                        config=config_to_mapping(cfg), log=ctx.log,
                        stopping=stopping.is_set, clock=ctx.clock.monotonic,
                        wall=ctx.clock.wall,
                        processes=lambda: process_rows(ctx.zctx, ctx.paths.control),
                        container_stats=lambda: client().list_container_stats(),
                        image_fs_info=lambda: client().image_fs_info(),
                        runtime=client)
    runner = web.AppRunner(app, access_log=None, handle_signals=False,
                           shutdown_timeout=SHUTDOWN_TIMEOUT)
    await runner.setup()
    address = cfg.address or "127.0.0.1"
    try:
        site = web.TCPSite(runner, address, cfg.port, reuse_address=True, ssl_context=ssl_ctx)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    ctx.log.info("mainport.listening", address=address, port=cfg.port,
                 tokens=authn.token_count, client_ca=bool(authn_cfg.client_ca_file),
                 anonymous=authn_cfg.anonymous_enabled, webhook=authn_cfg.webhook_enabled,
                 authorization=cfg.authorization.mode)
    return runner


async def _serve(ctx: ChildContext, pump: ReplicaPump) -> None:
    runners: list[web.AppRunner] = []
    stopped = asyncio.Event()
    died: list[PumpDied] = []
    loop = asyncio.get_running_loop()
    if ctx.config.read_only_port:
        runners.append(await _start_read_only(ctx, pump))
    if ctx.stop_fd is not None:  # stop wakes the loop at once; else seen within a heartbeat
        loop.add_reader(ctx.stop_fd, stopped.set)

    timers: list[asyncio.TimerHandle] = []
    main_tasks: list[asyncio.Task[None]] = []

    async def start_main() -> None:
        try:
            runners.append(await _start_main(ctx, pump, stopped))
        except (TlsError, AuthConfigError, OSError) as exc:
            ctx.log.error("mainport.failed", port=ctx.config.port, error=str(exc),
                          retry_in=MAIN_RETRY)
            if not stopped.is_set():
                timers.append(loop.call_later(MAIN_RETRY, schedule_main))

    def schedule_main() -> None:
        main_tasks[:] = [loop.create_task(start_main())]

    if ctx.config.port:
        schedule_main()

    def tick() -> None:
        """Every heartbeat interval, on the loop (a timer, not a task per wait): heartbeat,
        check the pump thread and ``ctx.stop``."""
        ctx.heartbeat()
        if not pump.alive():
            died.append(PumpDied(f"replica pump thread died: {pump.error!r}"))
        if died or ctx.stop.is_set():
            stopped.set()
        else:
            timers.append(loop.call_later(ctx.heartbeat_interval, tick))
        timers[:] = [t for t in timers if not t.cancelled() and t.when() > loop.time()]

    timers.append(loop.call_later(0, tick))
    try:
        await stopped.wait()
        if died:
            raise died[0]
    finally:
        for timer in timers:
            timer.cancel()
        for task in main_tasks:
            await task
        if ctx.stop_fd is not None:
            loop.remove_reader(ctx.stop_fd)
        for runner in runners:
            await runner.cleanup()


def run(ctx: ChildContext) -> None:
    if ctx.config.read_only_port == 0 and ctx.config.port == 0:
        ctx.log.info("server.disabled", reason="readOnlyPort and port are 0")
        while not ctx.sleep(3600):
            pass
        return
    pump = ReplicaPump(ctx.zctx, ctx.paths, ctx.clock)
    pump.start()
    try:
        asyncio.run(_serve(ctx, pump))
    finally:
        pump.close()
