"""The server process: the read-only HTTP port (kubelet ``readOnlyPort``) on ``address``.

Threads: the main thread runs the asyncio loop (aiohttp, and a task that heartbeats and watches
``ctx.stop`` and the pump thread); one ``ReplicaPump`` thread owns every zmq socket. If the pump
thread dies the process exits with an error so the supervisor restarts it. ``readOnlyPort: 0``
disables the port: the process then only heartbeats until it is stopped.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from podvisor.common.child import ChildContext
from podvisor.services.server.app import make_app
from podvisor.services.server.replicas import ReplicaPump


class PumpDied(RuntimeError):
    pass


async def _serve(ctx: ChildContext, pump: ReplicaPump) -> None:
    app = make_app(lambda: pump.view, clock=ctx.clock.monotonic, wall=ctx.clock.wall,
                   refresh=pump.refresh)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    address = ctx.config.address or "127.0.0.1"
    site = web.TCPSite(runner, address, ctx.config.read_only_port, reuse_address=True)
    await site.start()
    ctx.log.info("server.listening", address=address, port=ctx.config.read_only_port)
    stopped = asyncio.Event()
    died: list[PumpDied] = []
    loop = asyncio.get_running_loop()
    if ctx.stop_fd is not None:  # stop wakes the loop at once; else seen within a heartbeat
        loop.add_reader(ctx.stop_fd, stopped.set)

    timers: list[asyncio.TimerHandle] = []

    def tick() -> None:
        """Every heartbeat interval, on the loop (a timer, not a task per wait): heartbeat,
        check the pump thread and ``ctx.stop``."""
        ctx.heartbeat()
        if not pump.alive():
            died.append(PumpDied(f"replica pump thread died: {pump.error!r}"))
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
    if ctx.config.read_only_port == 0:
        ctx.log.info("server.disabled", reason="readOnlyPort is 0")
        while not ctx.sleep(3600):
            pass
        return
    pump = ReplicaPump(ctx.zctx, ctx.paths, ctx.clock)
    pump.start()
    try:
        asyncio.run(_serve(ctx, pump))
    finally:
        pump.close()
