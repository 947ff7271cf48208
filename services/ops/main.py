"""The ops process: the ops port (``opsAddress``:``opsPort``), supervised like every subsystem.

Threads: the main thread runs the asyncio loop (aiohttp; a timer heartbeats and watches
``ctx.stop`` and the map pump); one ``MapPump`` thread owns the replicas' zmq sockets; XML-RPC
requests run on a small worker pool (they block on control and CRI calls). Killed with -9, the
supervisor restarts it like any other subsystem; it keeps no state of its own (the password file
is the agent's, written at start).
"""

from __future__ import annotations

import asyncio
import ssl
import threading

from aiohttp import web

from podvisor.common.child import ChildContext
from podvisor.common.config import ops_password_path
from podvisor.common.endpoint import cri_endpoint
from podvisor.common.opspass import read_ops_password
from podvisor.services.cri import RuntimeClient, new_runtime_client
from podvisor.services.ops.app import make_app
from podvisor.services.ops.control import ControlLink
from podvisor.services.ops.dashboard import add_dashboard
from podvisor.services.ops.pump import MapPump
from podvisor.services.ops.rpc import OpsRpc, RpcDeps, new_dispatcher

CRI_CALL_TIMEOUT = 30.0


class PumpDied(RuntimeError):
    pass


def _tls(ctx: ChildContext) -> ssl.SSLContext | None:
    cfg = ctx.config
    if not cfg.ops_tls_cert_file:
        return None
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cfg.ops_tls_cert_file, cfg.ops_tls_private_key_file)
    return tls


async def _serve(ctx: ChildContext, pump: MapPump, rpc: OpsRpc, password: str) -> None:
    cfg = ctx.config
    app = make_app(new_dispatcher(rpc), cfg.ops_username, password,
                   lambda a, ex: add_dashboard(a, rpc, lambda: pump.maps, ex, ctx.clock))
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, cfg.ops_address, cfg.ops_port, reuse_address=True,
                       ssl_context=_tls(ctx))
    await site.start()
    ctx.log.info("ops.listening", address=cfg.ops_address, port=cfg.ops_port,
                 tls=bool(cfg.ops_tls_cert_file))
    stopped = asyncio.Event()
    died: list[PumpDied] = []
    loop = asyncio.get_running_loop()
    if ctx.stop_fd is not None:
        loop.add_reader(ctx.stop_fd, stopped.set)
    timers: list[asyncio.TimerHandle] = []

    def tick() -> None:
        ctx.heartbeat()
        if not pump.alive():
            died.append(PumpDied(f"map pump thread died: {pump.error!r}"))
        if died or ctx.stop.is_set():
            stopped.set()
        else:
            timers[:] = [loop.call_later(ctx.heartbeat_interval, tick)]

    timers.append(loop.call_later(0, tick))
    try:
        await stopped.wait()
        if died:
            raise died[0]
    finally:
        for timer in timers:
            timer.cancel()
        if ctx.stop_fd is not None:
            loop.remove_reader(ctx.stop_fd)
        await runner.cleanup()


def run(ctx: ChildContext) -> None:
    cfg = ctx.config
    if cfg.ops_port == 0:
        ctx.log.info("ops.disabled", reason="opsPort is 0")
        while not ctx.sleep(3600):
            pass
        return
    password = read_ops_password(ops_password_path(cfg))
    changed = threading.Condition()

    def on_change() -> None:
        with changed:
            changed.notify_all()

    pump = MapPump(ctx.zctx, ctx.paths, ctx.clock, on_change)
    cri_lock, cri_box = threading.Lock(), list[RuntimeClient]()

    def cri() -> RuntimeClient:
        with cri_lock:
            if not cri_box:
                endpoint = cri_endpoint(cfg.runtime_endpoint, ctx.paths.cri_socket)
                cri_box.append(new_runtime_client(endpoint, timeout=CRI_CALL_TIMEOUT))
            return cri_box[0]

    rpc = OpsRpc(RpcDeps(
        control=ControlLink(ctx.zctx, ctx.paths.control), maps=lambda: pump.maps,
        changed=changed, cri=cri, logs_dir=ctx.paths.logs_dir,
        runtime_dir=ctx.paths.runtime_dir if cfg.runtime_endpoint == "embedded" else None,
        identification=f"podvisor@{cfg.node_name}", self_name=ctx.name, clock=ctx.clock))
    pump.start()
    try:
        asyncio.run(_serve(ctx, pump, rpc, password))
    finally:
        pump.close()
