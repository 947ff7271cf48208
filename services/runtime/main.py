"""The supervised ``runtime`` process: serve runtime.v1 on ``paths.cri_socket`` with state under
``paths.runtime_dir``, heartbeat while serving, and return when ``ctx.stop`` is set."""

from __future__ import annotations

import threading
from typing import Any, Protocol

from podvisor.common import crashpoints
from podvisor.services.runtime.server import RuntimeServer

HEARTBEAT_EVERY = 1.0  # seconds, unless the context says otherwise (heartbeat_interval)


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
    config = getattr(ctx, "config", None)
    registries = getattr(config, "image_registries", None) or {}
    server = RuntimeServer(ctx.paths.runtime_dir, ctx.paths.cri_socket, ctx.log, registries,
                           crashpoints.from_env("runtime"))
    server.start()
    # Beat at the supervisor's own interval, like the other services (it was every 0.25 s:
    # three needless wake-ups a second); stop still ends the wait at once.
    every = float(getattr(ctx, "heartbeat_interval", HEARTBEAT_EVERY))
    try:
        while not ctx.stop.is_set():
            ctx.heartbeat()
            ctx.stop.wait(every)
    finally:
        server.stop()
