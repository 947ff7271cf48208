"""Process ``volumes`` (runs with ``kubeconfig``): the volume manager (see ``service.py``)."""

from __future__ import annotations

from podvisor.common.child import ChildContext
from podvisor.services.volumes.service import VolumeService


def run(ctx: ChildContext) -> None:
    service = VolumeService(ctx)
    try:
        service.run()
    finally:
        service.close()
