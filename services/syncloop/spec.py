"""The container spec hash stored in ``io.kubernetes.container.hash`` (from services/pod).

A change of the hash replaces a running container; editing one container leaves the others.
Its CPU and memory are not in it: their change is an in-place resize (``resize.py``)."""

from __future__ import annotations

from collections.abc import Callable

from podvisor.services.pod import Container, container_hash, legacy_container_hash

__all__ = ["container_hash", "same_spec"]


def same_spec(recorded: str, c: Container, hasher: Callable[[Container], str]) -> bool:
    """Was the container whose hash label is ``recorded`` made from spec ``c``? With the
    default hasher a container made before in-place resize (its hash covered its resources)
    matches too while ``c`` (the pod's allocated resources) still has those resources."""
    if recorded == hasher(c):
        return True
    return hasher is container_hash and recorded == legacy_container_hash(c)
