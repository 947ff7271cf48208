"""Stable hashes of model objects (pure)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from podvisor.services.pod.container import Container
from podvisor.services.pod.defaults import TERMINATION_MESSAGE_PATH, TERMINATION_MESSAGE_POLICY


def canonical_json(obj: Any) -> bytes:
    """Key-sorted, whitespace-free JSON: equal objects give equal bytes in any process."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def container_hash(container: Container) -> str:
    """The container spec hash (16 hex digits), like the kubelet's ``HashContainer``.

    It covers the whole defaulted container spec but its CPU and memory and ``resizePolicy``
    (the kubelet >= 1.31 hashes only name and image because API pods' specs are immutable; a
    static pod's spec is not). A running container whose recorded hash differs from its spec's
    hash is restarted; a change of its CPU or memory is an in-place resize instead
    (``syncloop/resize.py``), which restarts it only when its ``resizePolicy`` says so.
    """
    spec = container.to_dict()
    spec.pop("resizePolicy", None)
    fixed = {part: rest for part, amounts in spec.pop("resources", {}).items()
             if (rest := {k: v for k, v in amounts.items() if k not in ("cpu", "memory")})}
    if fixed:  # hugepages, ephemeral-storage: not resizable in place
        spec["resources"] = fixed
    return _digest(spec)


def legacy_container_hash(container: Container) -> str:
    """The hash containers created before in-place resize carry (it covered ``resources``
    too): such a container still matches its spec while its resources are the ones it was
    created with, so upgrading podvisor restarts nothing."""
    spec = container.to_dict()
    spec.pop("resizePolicy", None)
    return _digest(spec)


def _digest(spec: dict[str, Any]) -> str:
    # Defaults added after the hash was pinned stay out of it while they hold their default,
    # so adding them restarted no container.
    for key, default in _LATER_DEFAULTS.items():
        if spec.get(key) == default:
            del spec[key]
    return hashlib.sha256(canonical_json(spec)).hexdigest()[:16]


_LATER_DEFAULTS = {"terminationMessagePath": TERMINATION_MESSAGE_PATH,
                   "terminationMessagePolicy": TERMINATION_MESSAGE_POLICY}
