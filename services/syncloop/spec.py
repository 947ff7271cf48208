"""The container spec hash stored in ``io.kubernetes.container.hash`` (from services/pod).

A change of the hash replaces a running container; editing one container leaves the others."""

from __future__ import annotations

from podvisor.services.pod import container_hash

__all__ = ["container_hash"]
