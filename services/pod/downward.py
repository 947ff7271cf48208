"""The downward API: validating ``fieldRef`` / ``resourceFieldRef`` as the API server does
(``pkg/apis/core/validation``), and their values as the kubelet computes them
(``podFieldSelectorRuntimeValue``, ``pkg/fieldpath``, ``pkg/api/v1/resource``). Pure.

Values need what the pod alone does not hold: the node's allocatable CPU, memory and
ephemeral-storage (the kubelet's default for an unset limit: ``MergeContainerResourceLimits``;
hugepages have none, their limit is always set), the host's IPs and the pod's IPs;
``NodeFacts`` and ``pod_ips`` carry them in.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from podvisor.common.quantity import QuantityError, parse_quantity
from podvisor.services.pod import defaults as D
from podvisor.services.pod import names
from podvisor.services.pod.container import (
    Container,
    ObjectFieldSelector,
    ResourceFieldSelector,
    ResourceList,
)
from podvisor.services.pod.fields import Findings, as_map, check_fields, get_str, join
from podvisor.services.pod.model import DownwardAPIFile, Pod

ENV_FIELD_PATHS = frozenset({"metadata.name", "metadata.namespace", "metadata.uid",
                             "spec.nodeName", "spec.serviceAccountName", "status.hostIP",
                             "status.hostIPs", "status.podIP", "status.podIPs"})
VOLUME_FIELD_PATHS = frozenset({"metadata.name", "metadata.namespace", "metadata.uid",
                                "metadata.labels", "metadata.annotations"})
# ConvertDownwardAPIFieldLabel: every label it converts (some then fail "Unsupported value").
_CONVERTIBLE = frozenset({"metadata.annotations", "metadata.labels", "metadata.name",
                          "metadata.namespace", "metadata.uid", "spec.nodeName",
                          "spec.restartPolicy", "spec.serviceAccountName", "spec.schedulerName",
                          "status.phase", "status.hostIP", "status.hostIPs", "status.podIP",
                          "status.podIPs"})
RESOURCES = ("limits.cpu", "limits.memory", "limits.ephemeral-storage", "requests.cpu",
             "requests.memory", "requests.ephemeral-storage")
# validContainerResourceFieldPathPrefixesWithDownwardAPIHugePages: any page size is taken
_HUGEPAGES = ("limits.hugepages-", "requests.hugepages-")
_CPU_DIVISORS = {Decimal("0.001"): "1m", Decimal(1): "1"}
_MEMORY_DIVISORS = {parse_quantity(s): s for s in ("1", "1k", "1M", "1G", "1T", "1P", "1E",
                                                   "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei")}
FIELD_REF_KNOWN = ("apiVersion", "fieldPath")
RESOURCE_FIELD_REF_KNOWN = ("containerName", "resource", "divisor")


def _quote_list(values: Collection[str]) -> str:
    return ", ".join(f'"{v}"' for v in sorted(values))


def split_subscript(path: str) -> tuple[str, str] | None:
    """``metadata.labels['app']`` -> (``metadata.labels``, ``app``); None without one
    (``fieldpath.SplitMaybeSubscriptedPath``)."""
    if not path.endswith("']"):
        return None
    head, sep, key = path[:-2].partition("['")
    if not sep or not head:
        return None
    return head, key


def parse_field_ref(f: Findings, raw: Any, where: str,
                    allowed: frozenset[str]) -> ObjectFieldSelector | None:
    """A ``fieldRef`` checked as ``validateObjectFieldSelector`` does."""
    m = as_map(f, raw, where)
    if m is None:
        return None
    check_fields(f, m, where, FIELD_REF_KNOWN, {})
    version = get_str(f, m, "apiVersion", where) or D.FIELD_REF_API_VERSION
    path = get_str(f, m, "fieldPath", where)
    if not path:
        f.error(join(where, "fieldPath"), "Required value")
        return None
    if version != "v1":
        f.error(join(where, "fieldPath"), f'Invalid value: "{path}": error converting '
                                          f"fieldPath: unsupported pod version: {version}")
        return None
    sub = split_subscript(path)
    if sub is not None:
        head, key = sub
        if head not in ("metadata.labels", "metadata.annotations"):
            f.error(join(where, "fieldPath"), f'Invalid value: "{path}": error converting '
                                              f"fieldPath: field label does not support "
                                              f"subscript: {path}")
            return None
        reason = names.qualified_name(key.lower() if head == "metadata.annotations" else key)
        if reason:
            f.error(where, f'Invalid value: "{key}": {reason}')
            return None
    elif path not in _CONVERTIBLE:
        f.error(join(where, "fieldPath"), f'Invalid value: "{path}": error converting '
                                          f"fieldPath: field label not supported: {path}")
        return None
    elif path not in allowed:
        f.error(join(where, "fieldPath"),
                f'Unsupported value: "{path}": supported values: {_quote_list(allowed)}')
        return None
    return ObjectFieldSelector(field_path=path, api_version=version)


def parse_resource_field_ref(f: Findings, raw: Any, where: str,
                             volume: bool) -> ResourceFieldSelector | None:
    """A ``resourceFieldRef`` checked as ``validateContainerResourceFieldSelector`` does
    (``containerName`` is required in volumes)."""
    m = as_map(f, raw, where)
    if m is None:
        return None
    check_fields(f, m, where, RESOURCE_FIELD_REF_KNOWN, {})
    container = get_str(f, m, "containerName", where)
    resource = get_str(f, m, "resource", where)
    if volume and not container:
        f.error(join(where, "containerName"), "Required value")
        return None
    if not resource:
        f.error(join(where, "resource"), "Required value")
        return None
    if resource not in RESOURCES and not resource.startswith(_HUGEPAGES):
        f.error(join(where, "resource"),
                f'Unsupported value: "{resource}": supported values: {_quote_list(RESOURCES)}')
        return None
    divisor = _divisor(f, m.get("divisor"), resource, join(where, "divisor"))
    if divisor is None:
        return None
    return ResourceFieldSelector(resource=resource, container_name=container, divisor=divisor)


def _divisor(f: Findings, raw: Any, resource: str, where: str) -> str | None:
    if raw is None:
        return D.RESOURCE_FIELD_DIVISOR
    try:
        amount = parse_quantity(raw)
    except QuantityError as exc:
        f.error(where, str(exc))
        return None
    if amount == 0:
        return D.RESOURCE_FIELD_DIVISOR
    cpu = resource.endswith(".cpu")
    table = _CPU_DIVISORS if cpu else _MEMORY_DIVISORS
    canonical = table.get(amount)
    if canonical is None:
        allowed = "1m and 1" if cpu else ", ".join(_MEMORY_DIVISORS.values())
        kind = ("cpu" if cpu else "hugepages" if resource.startswith(_HUGEPAGES)
                else "local ephemeral storage" if "ephemeral-storage" in resource
                else "memory")  # validateContainerResourceDivisor's words
        f.error(where, f'Invalid value: "{resource}": only divisor\'s values {allowed} are '
                       f"supported with the {kind} resource")
        return None
    return canonical


# --- values -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeFacts:
    """What the node adds to downward API values: allocatable CPU (millicores), memory and
    ephemeral-storage (bytes; None: the node reports none, an unset limit then reads 0), the
    defaults for unset limits, and its IPs (``status.hostIP(s)``)."""

    cpu_millis: int
    memory_bytes: int
    host_ips: tuple[str, ...] = ("127.0.0.1",)
    ephemeral_storage_bytes: int | None = None


def go_quote(text: str) -> str:
    """Go's ``%q`` of a string (``strconv.Quote``): printable runes kept, the rest escaped."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
               "\v": "\\v"}


def format_map(m: Mapping[str, str]) -> str:
    """``fieldpath.FormatMap``: ``key="value"`` lines in key order, no trailing newline."""
    return "\n".join(f"{k}={go_quote(m[k])}" for k in sorted(m))


def field_value(pod: Pod, selector: ObjectFieldSelector, node: NodeFacts,
                pod_ips: Sequence[str]) -> str:
    """The value of a validated ``fieldRef`` for ``pod``."""
    path = selector.field_path
    meta = pod.metadata
    sub = split_subscript(path)
    if sub is not None:
        source = meta.labels if sub[0] == "metadata.labels" else meta.annotations
        return str(source.get(sub[1], ""))
    simple: dict[str, Any] = {
        "metadata.name": meta.name, "metadata.namespace": meta.namespace,
        "metadata.uid": meta.uid, "spec.nodeName": pod.spec.node_name,
        "spec.serviceAccountName": pod.spec.service_account_name,
        "status.hostIP": node.host_ips[0] if node.host_ips else "",
        "status.hostIPs": ",".join(node.host_ips),
        "status.podIP": pod_ips[0] if pod_ips else "",
        "status.podIPs": ",".join(pod_ips),
    }
    if path in simple:
        return str(simple[path])
    if path == "metadata.labels":
        return format_map(meta.labels)
    if path == "metadata.annotations":
        return format_map(meta.annotations)
    raise ValueError(f"unsupported fieldPath {path!r}")


def _amount(resource: str, rl: ResourceList) -> int | None:
    """The bytes of ``memory``, ``ephemeral-storage`` or ``hugepages-<size>`` in ``rl``."""
    if resource == "memory":
        return rl.memory_bytes
    if resource == "ephemeral-storage":
        return rl.ephemeral_storage_bytes
    size = resource.removeprefix("hugepages-")
    return next((amount for s, amount in rl.hugepages if s == size), None)


def resource_value(selector: ResourceFieldSelector, container: Container,
                   node: NodeFacts) -> str:
    """``ExtractContainerResourceValue`` with the kubelet's node-allocatable defaults for an
    unset (or zero) cpu, memory or ephemeral-storage limit (``MergeContainerResourceLimits``;
    not hugepages, "never overcommitted"): ceil(amount / divisor), CPU counted in
    millicores; an amount not set reads 0."""
    limits, requests = container.resources.limits, container.resources.requests
    divisor = Decimal(0) if selector.divisor == "0" else parse_quantity(selector.divisor)
    if divisor == 0:
        divisor = Decimal(1)
    side, _, resource = selector.resource.partition(".")
    if resource == "cpu":
        if side == "limits":
            millis = limits.cpu_millis or node.cpu_millis
        else:
            millis = requests.cpu_millis or 0
        return str(math.ceil(Decimal(millis) / (divisor * 1000)))
    amount = _amount(resource, limits if side == "limits" else requests)
    if amount is None and side == "requests" and resource.startswith("hugepages-"):
        amount = _amount(resource, limits)  # the API server's defaulting: request = limit
    if side == "limits" and not amount:
        amount = {"memory": node.memory_bytes,
                  "ephemeral-storage": node.ephemeral_storage_bytes}.get(resource)
    return str(math.ceil(Decimal(amount or 0) / divisor))


def find_container(pod: Pod, name: str) -> Container | None:
    for c in pod.all_containers():
        if c.name == name:
            return c
    return None


def volume_files(pod: Pod, items: Sequence[DownwardAPIFile], default_mode: int,
                 node: NodeFacts) -> dict[str, tuple[bytes, int]]:
    """A downwardAPI volume's files (``CollectData``): path -> (content, mode). Raises
    ValueError for a missing container."""
    out: dict[str, tuple[bytes, int]] = {}
    for item in items:
        mode = default_mode if item.mode is None else item.mode
        if isinstance(item.source, ObjectFieldSelector):
            text = field_value(pod, item.source, node, ())
        else:
            target = find_container(pod, item.source.container_name)
            if target is None:
                raise ValueError(f"container {item.source.container_name!r} not found")
            text = resource_value(item.source, target, node)
        out[item.path.strip("/")] = (text.encode(), mode)
    return out


def projected_downward_files(pod: Pod, raw: Mapping[str, Any], default_mode: int,
                             node: NodeFacts) -> dict[str, tuple[bytes, int]]:
    """The files of a projected volume's ``downwardAPI`` source as written in the pod (validated
    again here). Raises ValueError when it is not valid."""
    from podvisor.services.pod.fields import Findings
    from podvisor.services.pod.parse_spec import _parse_downward_api

    f = Findings()
    parsed = _parse_downward_api(f, raw, "downwardAPI",
                                 frozenset(c.name for c in pod.all_containers()))
    if parsed is None or f.errors:
        raise ValueError("downwardAPI: " + "; ".join(f"{e.field}: {e.reason}"
                                                      for e in f.errors))
    return dict(volume_files(pod, parsed.items, default_mode, node))
