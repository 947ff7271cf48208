"""The ops process's entry: composition only. The ops port (``opsAddress``:``opsPort``) on a
web thread (``common.web``), beside the service loop that owns the pods' maps (``pump.py``),
heartbeats and watches ``ctx.stop``; supervised like every subsystem.

Threads: the main thread runs the ``ServiceLoop`` (every zmq socket); the web thread runs the
asyncio loop (aiohttp); XML-RPC requests run on a small worker pool (they block on control and
CRI calls). If the web thread dies the process exits with an error; killed with -9, the
supervisor restarts it like any other subsystem; it keeps no state of its own (the password file
is the agent's, written at start). With ``opsPort: 0`` the supervisor does not spawn it
(supervisor/registry.py).
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable
from typing import Any

from podvisor.common.child import ChildContext
from podvisor.common.config import ops_password_path
from podvisor.common.endpoint import cri_endpoint
from podvisor.common.opspass import read_ops_password
from podvisor.common.web import WebService
from podvisor.ipc.control import ControlClient
from podvisor.services.cri import RuntimeClient, new_runtime_client
from podvisor.services.ops.app import make_app
from podvisor.services.ops.charts import ChartFeed, add_charts
from podvisor.services.ops.dashboard import add_dashboard
from podvisor.services.ops.pump import MapPump, PodMaps
from podvisor.services.ops.rpc import OpsRpc, RpcDeps, new_dispatcher
from podvisor.services.ops.sampler import INTERVAL, Sampler, follow_states
from podvisor.services.ops.usage import UsageStore

CRI_CALL_TIMEOUT = 30.0
SHUTDOWN_TIMEOUT = 1.0


def _held(view: Callable[[], PodMaps]) -> Callable[[], tuple[str, ...]]:
    """The pressure conditions the eviction manager holds True, from the maps now."""
    def held() -> tuple[str, ...]:
        pressure = view().pressure
        return pressure.conditions if pressure is not None else ()
    return held


def _tls(ctx: ChildContext) -> ssl.SSLContext | None:
    cfg = ctx.config
    if not cfg.ops_tls_cert_file:
        return None
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cfg.ops_tls_cert_file, cfg.ops_tls_private_key_file)
    return tls


def run(ctx: ChildContext) -> None:
    cfg = ctx.config
    password = read_ops_password(ops_password_path(cfg))
    web = WebService(ctx, PodMaps(), name="ops")
    pump = MapPump(web.loop, web.publish)
    cri_lock, cri_box = threading.Lock(), list[RuntimeClient]()

    def cri() -> RuntimeClient:
        with cri_lock:
            if not cri_box:
                endpoint = cri_endpoint(cfg.runtime_endpoint, ctx.paths.cri_socket, cfg.cri_proxy)
                cri_box.append(new_runtime_client(endpoint, timeout=CRI_CALL_TIMEOUT))
            return cri_box[0]

    rpc = OpsRpc(RpcDeps(
        control=ControlClient(ctx.paths.control, 30.0, ctx.zctx), maps=lambda: web.view,
        changed=web.changed, cri=cri, logs_dir=ctx.paths.logs_dir,
        runtime_dir=ctx.paths.runtime_dir if cfg.runtime_endpoint == "embedded" else None,
        identification=f"podvisor@{cfg.node_name}", self_name=ctx.name, clock=ctx.clock,
        process_specs=cfg.supervision.processes))

    # the charts: a sample of every subsystem, pod and container every INTERVAL (sampler.py)
    sampler = Sampler(UsageStore(INTERVAL), cri, lambda: web.view.statuses,
                      lambda: rpc.d.control.processes(timeout=5.0),
                      ctx.clock, ctx.paths.root, held=_held(lambda: web.view))
    follow_states(web.loop, sampler.on_state)
    charts: list[ChartFeed] = []

    def routes(app: Any, executor: Any) -> None:
        dash = add_dashboard(app, rpc, lambda: web.view, executor, web, ctx.clock)
        charts.append(add_charts(app, sampler, dash, executor, INTERVAL, ctx.log))

    async def serve(web: WebService[Any]) -> None:
        app = make_app(new_dispatcher(rpc), cfg.ops_username, password, routes)
        await web.site(app, cfg.ops_address, cfg.ops_port, ssl_context=_tls(ctx),
                       shutdown_timeout=SHUTDOWN_TIMEOUT)
        charts[0].start(web)
        ctx.log.info("ops.listening", address=cfg.ops_address, port=cfg.ops_port,
                     tls=bool(cfg.ops_tls_cert_file))

    try:
        web.run(serve, pump.drain)
    finally:
        web.close()
