"""Where the CRI runtime is: the config's ``runtimeEndpoint`` resolved (the one definition)."""

from __future__ import annotations

from pathlib import Path

EMBEDDED = "embedded"


def cri_endpoint(runtime_endpoint: str, cri_socket: Path | str, proxied: bool = False) -> str:
    """The gRPC target the node's clients dial: ``embedded`` is the embedded runtime's
    ``run/cri.sock``; anything else (``unix:///...``) is used as it is, unless ``proxied``
    (``criProxy``: the runtime process proxies it on ``run/cri.sock``, for cri faults)."""
    if runtime_endpoint == EMBEDDED or proxied:
        return f"unix://{cri_socket}"
    return runtime_endpoint


def is_embedded(runtime_endpoint: str) -> bool:
    return runtime_endpoint == EMBEDDED


def runtime_name(runtime_endpoint: str) -> str:
    """The containerID scheme: ``embedded://`` or e.g. ``containerd://``."""
    if runtime_endpoint == EMBEDDED:
        return EMBEDDED
    return "containerd" if "containerd" in runtime_endpoint else "cri"
