"""The supervised ``runtime`` process: serve runtime.v1 on ``paths.cri_socket`` with state under
``paths.runtime_dir``, heartbeat while serving, and return when ``ctx.stop`` is set."""

from __future__ import annotations

import threading
from typing import Any, Protocol

from podvisor.services.runtime.server import RuntimeServer

HEARTBEAT_EVERY = 0.25  # seconds; well under the default 1 s heartbeat interval


class _Paths(Protocol):
    @property
    def runtime_dir(self) -> Any: ...
    @property
    def cri_socket(self) -> Any: ...


class _Ctx(Protocol):
    """The part of podvisor.supervisor.child.ChildContext this service uses."""

    paths: _Paths
    log: Any
    stop: threading.Event

    def heartbeat(self) -> None: ...


def run(ctx: _Ctx) -> None:
    server = RuntimeServer(ctx.paths.runtime_dir, ctx.paths.cri_socket, ctx.log)
    server.start()
    try:
        while not ctx.stop.is_set():
            ctx.heartbeat()
            ctx.stop.wait(HEARTBEAT_EVERY)
    finally:
        server.stop()
