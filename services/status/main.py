"""The status process's entry: composition only (build the service, run its loop). What it
does is in ``service.py``."""

from __future__ import annotations

from podvisor.common.child import ChildContext
from podvisor.services.status.service import StatusService


def run(ctx: ChildContext) -> None:
    service = StatusService(ctx)
    try:
        service.run()
    finally:
        service.close()
