"""Process ``volumes``: the volume manager (see ``service.py``). It runs always (issue 24: the
volume plugins mount static pods' volumes too); the API-backed volumes need ``kubeconfig``."""

from __future__ import annotations

from podvisor.common.child import ChildContext
from podvisor.services.volumes.service import VolumeService


def run(ctx: ChildContext) -> None:
    service = VolumeService(ctx)
    try:
        service.run()
    finally:
        service.close()
