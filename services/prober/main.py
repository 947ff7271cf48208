"""The prober process's entry: composition only (build the CRI client, the probe runner and
the service, run its loop). What it does is in ``service.py``."""

from __future__ import annotations

from podvisor.common.child import ChildContext
from podvisor.common.endpoint import cri_endpoint
from podvisor.services.cri import new_runtime_client
from podvisor.services.prober.handlers import LazyClient, new_probe_runner
from podvisor.services.prober.service import CALL_TIMEOUT, ProberService


def run(ctx: ChildContext) -> None:
    timeout = min(ctx.config.runtime_request_timeout, CALL_TIMEOUT)
    cri = LazyClient(lambda: new_runtime_client(
        cri_endpoint(ctx.config.runtime_endpoint, ctx.paths.cri_socket, ctx.config.cri_proxy),
        timeout=timeout))
    service = ProberService(ctx, new_probe_runner(cri))
    try:
        service.run()
    finally:
        service.close()
        cri.close()
