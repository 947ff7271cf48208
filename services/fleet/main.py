"""``podvisor fleet --config FLEET.yaml``: one page over many nodes (composition only).

Runs in the foreground until SIGTERM/SIGINT: an aiohttp server (``server.py``) over one
``NodeLink`` per node (``link.py``), the nodes from the config and, with a kubeconfig, from the
cluster's Nodes (``nodes.py``, listed again every ``relist``). Not a subsystem of an agent:
it supervises nothing and keeps no state; restarted, it reconnects to every node.
Exit codes: 0 after SIGTERM/SIGINT, 2 for a bad config (the key named), 1 when the address
cannot be bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import ssl
import sys
from pathlib import Path

import aiohttp
from aiohttp import web

from podvisor.ipc.clock import SYSTEM_CLOCK, Clock
from podvisor.services.fleet.config import FleetConfig, FleetConfigError, load_fleet_config
from podvisor.services.fleet.link import NodeLink
from podvisor.services.fleet.nodes import cluster_nodes
from podvisor.services.fleet.rpc import FleetRpc
from podvisor.services.fleet.server import Fleet, make_fleet_app

__all__ = ["main_fleet", "serve_fleet"]


def main_fleet(config: Path) -> int:
    try:
        cfg = load_fleet_config(config)
    except FleetConfigError as err:
        print(f"podvisor fleet: {err}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve_fleet(cfg))
    except OSError as err:
        print(f"podvisor fleet: cannot listen on {cfg.address}:{cfg.port}: {err}",
              file=sys.stderr)
        return 1
    return 0


async def _relist(cfg: FleetConfig, fleet: Fleet, stop: asyncio.Event) -> None:
    static = {n.name for n in cfg.nodes}
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        try:
            specs = await loop.run_in_executor(None, cluster_nodes, cfg)
        except Exception as err:  # the API server does not answer: keep the nodes we have
            print(f"podvisor fleet: listing the cluster's Nodes: {err}", file=sys.stderr)
        else:
            wanted = {s.name: s for s in specs if s.name not in static}
            for name in [n for n in fleet.links if n not in static and n not in wanted]:
                await fleet.links.pop(name).stop()
            for name, spec in wanted.items():
                link = fleet.links.get(name)
                if link is not None and link.spec == spec:
                    continue
                if link is not None:
                    await link.stop()
                fleet.links[name] = NodeLink(spec, fleet.session, fleet.clock, fleet.changed)
                fleet.links[name].start()
            fleet.changed()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), cfg.relist)


async def serve_fleet(cfg: FleetConfig, clock: Clock = SYSTEM_CLOCK) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with aiohttp.ClientSession() as session:
        fleet = Fleet(session, clock)
        for spec in cfg.nodes:
            fleet.links[spec.name] = NodeLink(spec, session, clock, fleet.changed)
        app = make_fleet_app(fleet, FleetRpc(fleet.nodes, clock), cfg.username, cfg.password)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        tls = None
        if cfg.tls_cert_file and cfg.tls_private_key_file:
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.load_cert_chain(cfg.tls_cert_file, cfg.tls_private_key_file)
        try:
            await web.TCPSite(runner, cfg.address, cfg.port, reuse_address=True,
                              ssl_context=tls).start()
            scheme = "https" if tls else "http"
            print(f"podvisor fleet: {len(cfg.nodes)} nodes"
                  f"{' and the cluster' if cfg.kubeconfig else ''} on "
                  f"{scheme}://{cfg.address}:{cfg.port}/ (user {cfg.username})", flush=True)
            for link in fleet.links.values():
                link.start()
            tasks = [loop.create_task(_relist(cfg, fleet, stop))] if cfg.kubeconfig else []
            await stop.wait()
            for task in tasks:
                task.cancel()
        finally:
            for link in list(fleet.links.values()):
                await link.stop()
            await runner.cleanup()
