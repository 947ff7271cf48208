"""The runtime served inside another process: what `podvisorctl shutdown --pods` needs when no
agent runs (the supervised process is `main.py`, the standalone server `__main__.py`; all three
start the same `RuntimeServer`).

Imported by the package's front door, so it imports the server only when asked to serve: the
container monitors, forked from this package, stay small."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from podvisor.common.logs import Log

__all__ = ["serve_in_process"]


@contextlib.contextmanager
def serve_in_process(runtime_dir: Path, cri_socket: Path, log: Log,
                     registries: Mapping[str, Any] | None = None) -> Iterator[None]:
    """Serve runtime.v1 on `cri_socket` over the state in `runtime_dir`, on this process's
    threads, while the block runs. Entering raises what stopped the server from starting;
    leaving stops serving and leaves every container running (they belong to their monitors),
    as the runtime process's own stop does."""
    from podvisor.services.runtime.server import RuntimeServer

    server = RuntimeServer(runtime_dir, cri_socket, log, registries)
    server.start()
    try:
        yield
    finally:
        server.stop()
