"""The PLEG process's entry: composition only (build the CRI client, run the service's loop).
What it does is in ``service.py``."""

from __future__ import annotations

from podvisor.common.child import ChildContext
from podvisor.common.endpoint import cri_endpoint
from podvisor.services.cri import new_runtime_client
from podvisor.services.pleg.service import CALL_TIMEOUT, serve


def run(ctx: ChildContext) -> None:
    cfg = ctx.config
    endpoint = cri_endpoint(cfg.runtime_endpoint, ctx.paths.cri_socket, cfg.cri_proxy)
    client = new_runtime_client(endpoint, timeout=min(cfg.runtime_request_timeout, CALL_TIMEOUT))
    try:
        serve(ctx, client)
    finally:
        client.close()
