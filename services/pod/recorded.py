"""What the kubelet records on a container for the day its pod spec is gone (an orphan, or
``podvisorctl shutdown --pods`` with no agent), read back through the API's own parsers: the
preStop handler (``io.kubernetes.container.preStopHandler``, the LifecycleHandler's JSON) and
the container's ports (``io.kubernetes.container.ports``, for an httpGet hook's named port),
as the kubelet's ``restoreSpecsFromContainerLabels``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from podvisor.services.pod.container import ContainerPort, GRPCAction, LifecycleHandler
from podvisor.services.pod.fields import Findings
from podvisor.services.pod.parse_container import parse_ports
from podvisor.services.pod.parse_probe import LIFECYCLE_HANDLERS, parse_handler


def _load(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def recorded_ports(text: str) -> tuple[ContainerPort, ...]:
    """The ports recorded as JSON (a list of ContainerPort objects); () for none or a
    malformed record."""
    raw = _load(text)
    if not isinstance(raw, list):
        return ()
    f = Findings()
    ports = parse_ports(f, {"ports": raw}, "ports", host_network=False)
    return () if f.errors else ports


def recorded_handler(text: str, ports: tuple[ContainerPort, ...] = ()
                     ) -> LifecycleHandler | None:
    """The lifecycle handler recorded as JSON, validated as the API validates a hook; None for
    none or a malformed one. A named port is looked up in ``ports`` when the hook runs, as the
    kubelet's runner does (a container recorded without its ports fails the hook then)."""
    raw = _load(text)
    if not isinstance(raw, Mapping):
        return None
    names = {p.name for p in ports if p.name}
    names.update(body["port"] for body in raw.values()
                 if isinstance(body, Mapping) and isinstance(body.get("port"), str))
    f = Findings()
    handler = parse_handler(f, raw, "preStop", LIFECYCLE_HANDLERS, names)
    if f.errors or handler is None or isinstance(handler, GRPCAction):
        return None
    return handler
