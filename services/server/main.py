"""The server process's entry: composition only. The read-only port and the main port
(``ports.py``) on a web thread, beside the service loop that owns the ``desired``,
``statuses`` and ``pleg`` replicas (``replicas.py``) and heartbeats (``common.web``).

Threads: the main thread runs the ``ServiceLoop`` (every zmq socket, the heartbeat, ``ctx.stop``);
the web thread runs the asyncio loop (aiohttp). If the web thread dies the process exits with an
error so the supervisor restarts it. With both ports off (``readOnlyPort: 0``, ``port: 0``) the
supervisor does not spawn it (supervisor/registry.py).
"""

from __future__ import annotations

from podvisor.common.child import ChildContext
from podvisor.common.web import WebService
from podvisor.services.server.ports import Ports
from podvisor.services.server.replicas import BATCH, ServerReplicas, View


def run(ctx: ChildContext) -> None:
    web = WebService(ctx, View(), batch=BATCH, name="server")
    replicas = ServerReplicas(web.loop, web.publish)
    try:
        web.run(Ports(ctx), replicas.drain)
    finally:
        web.close()
