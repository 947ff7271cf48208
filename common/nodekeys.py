"""Parsers of the Node settings podvisor takes from KubeletConfiguration and the kubelet's flags
(issue 26): ``nodeIP``, ``nodeLabels``, ``registerWithTaints``, ``kubeReserved``,
``systemReserved`` and ``evictionHard``.

Each accepts the YAML form (a map or a list) and the kubelet flag's string form
(``--node-labels a=b,c=d``, ``--register-with-taints k=v:NoSchedule``, ``--kube-reserved
cpu=100m,memory=1Gi``, ``--eviction-hard memory.available<100Mi``), checks it as the kubelet's
option validation does, and raises ``ConfigError`` naming the key. The values are plain, JSON
ready (``config.json`` carries them back to the children).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any

from podvisor.common import quantity
from podvisor.common.values import ConfigError, parse_duration, parse_str

__all__ = [
    "DEFAULT_EVICTION_HARD",
    "EVICTION_SIGNALS",
    "RESERVABLE",
    "TAINT_EFFECTS",
    "parse_eviction_grace",
    "parse_eviction_hard",
    "parse_node_ips",
    "parse_node_labels",
    "parse_reserved",
    "parse_taints",
]

# KUBELET.md, "Node-pressure eviction": the Linux defaults of evictionHard
DEFAULT_EVICTION_HARD: dict[str, str] = {
    "memory.available": "100Mi", "nodefs.available": "10%", "nodefs.inodesFree": "5%",
    "imagefs.available": "15%", "imagefs.inodesFree": "5%"}
EVICTION_SIGNALS = ("memory.available", "allocatableMemory.available", "nodefs.available",
                    "nodefs.inodesFree", "imagefs.available", "imagefs.inodesFree",
                    "containerfs.available", "containerfs.inodesFree", "pid.available")
RESERVABLE = ("cpu", "memory", "ephemeral-storage", "pid")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

# k8s.io/kubelet/pkg/apis: the labels a kubelet may set on its own Node
KUBELET_LABELS = frozenset((
    "kubernetes.io/hostname", "topology.kubernetes.io/zone", "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type", "node.kubernetes.io/instance-type",
    "kubernetes.io/os", "kubernetes.io/arch", "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch"))
KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")

_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")


def _pairs(key: str, raw: object, sep: str = "=") -> dict[str, str]:
    """A map, or the flag form ``a=b,c=d``."""
    if isinstance(raw, str):
        out: dict[str, str] = {}
        for item in filter(None, (p.strip() for p in raw.split(","))):
            name, found, value = item.partition(sep)
            if not found or not name.strip():
                raise ConfigError(key, f"expected NAME{sep}VALUE, got {item!r}")
            out[name.strip()] = value.strip()
        return out
    if not isinstance(raw, Mapping):
        raise ConfigError(key, f"expected a map, got {type(raw).__name__}")
    result: dict[str, str] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(key, "keys must be non-empty strings")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ConfigError(f"{key}.{name}", f"expected a string, got {type(value).__name__}")
        result[name] = str(value)
    return result


def qualified_name_problem(name: str) -> str:
    """'' when ``name`` is a Kubernetes qualified name (``[prefix/]name``), else why not."""
    prefix, slash, short = name.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        return f"the prefix {prefix!r} must be a DNS subdomain (lower case, at most 253)"
    if not short or len(short) > 63 or not _NAME.match(short):
        return ("the name part must be at most 63 characters of [A-Za-z0-9_.-], starting and "
                "ending with a letter or digit")
    return ""


def _label_domain(name: str) -> str:
    return name.split("/", 1)[0] if "/" in name else ""


def _is_kubernetes_domain(domain: str) -> bool:
    return any(domain == d or domain.endswith("." + d) for d in ("kubernetes.io", "k8s.io"))


def _kubelet_may_set(name: str) -> bool:
    if name in KUBELET_LABELS:
        return True
    domain = _label_domain(name)
    return any(domain == ns or domain.endswith("." + ns) for ns in KUBELET_LABEL_NAMESPACES)


def parse_node_labels(key: str, raw: object) -> dict[str, str]:
    labels = _pairs(key, raw)
    for name, value in labels.items():
        if problem := qualified_name_problem(name):
            raise ConfigError(f"{key}.{name}", f"invalid label key: {problem}")
        if value and (len(value) > 63 or not _NAME.match(value)):
            raise ConfigError(f"{key}.{name}", f"invalid label value {value!r}: at most 63 "
                              "characters of [A-Za-z0-9_.-], starting and ending with a "
                              "letter or digit")
    unknown = sorted(n for n in labels if _is_kubernetes_domain(_label_domain(n))
                     and not _kubelet_may_set(n))
    if unknown:  # the kubelet's own message (cmd/kubelet/app/options)
        raise ConfigError(key, f"unknown 'kubernetes.io' or 'k8s.io' labels specified: "
                          f"{unknown}; labels in the 'kubernetes.io' namespace must begin with "
                          f"an allowed prefix ({', '.join(KUBELET_LABEL_NAMESPACES)}) or be in "
                          f"the specifically allowed set ({', '.join(sorted(KUBELET_LABELS))})")
    return labels


def parse_taints(key: str, raw: object) -> list[dict[str, str]]:
    """``[{key, value, effect}]`` or the flag form ``key=value:Effect,key2:Effect``."""
    items: list[Any]
    if isinstance(raw, str):
        items = []
        for text in filter(None, (p.strip() for p in raw.split(","))):
            body, colon, effect = text.rpartition(":")
            if not colon:
                raise ConfigError(key, f"expected KEY[=VALUE]:EFFECT, got {text!r}")
            name, _, value = body.partition("=")
            items.append({"key": name, "value": value, "effect": effect})
    elif isinstance(raw, list):
        items = list(raw)
    else:
        raise ConfigError(key, f"expected a list of taints, got {type(raw).__name__}")
    out: list[dict[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for i, item in enumerate(items):
        where = f"{key}[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(where, "expected a map with key, value and effect")
        for field in item:
            if field not in ("key", "value", "effect"):
                raise ConfigError(f"{where}.{field}", "unknown key (key, value, effect)")
        name = parse_str(f"{where}.key", item.get("key", ""))
        value = parse_str(f"{where}.value", item.get("value", ""))
        effect = parse_str(f"{where}.effect", item.get("effect", ""))
        if problem := qualified_name_problem(name):
            raise ConfigError(f"{where}.key", f"invalid taint key {name!r}: {problem}")
        if value and (len(value) > 63 or not _NAME.match(value)):
            raise ConfigError(f"{where}.value", f"invalid taint value {value!r}")
        if effect not in TAINT_EFFECTS:
            raise ConfigError(f"{where}.effect", f"expected one of {', '.join(TAINT_EFFECTS)}, "
                              f"got {effect!r}")
        if (name, effect) in seen:
            raise ConfigError(where, f"duplicate taint {name}:{effect}")
        seen.add((name, effect))
        out.append({"key": name, "value": value, "effect": effect} if value
                   else {"key": name, "effect": effect})
    return out


def parse_reserved(key: str, raw: object) -> dict[str, str]:
    """``kubeReserved``/``systemReserved``: resource -> quantity (cpu, memory,
    ephemeral-storage, pid)."""
    values = _pairs(key, raw)
    for name, value in values.items():
        if name not in RESERVABLE:
            raise ConfigError(f"{key}.{name}", f"unknown resource (one of "
                              f"{', '.join(RESERVABLE)})")
        try:
            quantity.parse_quantity(value)
        except quantity.QuantityError as exc:
            raise ConfigError(f"{key}.{name}", str(exc)) from None
    return values


def parse_eviction_hard(key: str, raw: object) -> dict[str, str]:
    """Signal -> threshold (a quantity or a percentage); the flag form is
    ``memory.available<100Mi,nodefs.available<10%``. A map given replaces the defaults whole,
    as in the kubelet (unset signals have no threshold)."""
    values = _pairs(key, raw, sep="<") if isinstance(raw, str) else _pairs(key, raw)
    for name, value in values.items():
        if name not in EVICTION_SIGNALS:
            raise ConfigError(f"{key}.{name}", f"unknown eviction signal (one of "
                              f"{', '.join(EVICTION_SIGNALS)})")
        if value.endswith("%"):
            try:
                percent = float(value[:-1])
            except ValueError:
                raise ConfigError(f"{key}.{name}", f"invalid percentage {value!r}") from None
            if not 0 <= percent <= 100:
                raise ConfigError(f"{key}.{name}", f"percentage must be within 0-100%, got "
                                  f"{value!r}")
            continue
        try:
            quantity.parse_quantity(value)
        except quantity.QuantityError as exc:
            raise ConfigError(f"{key}.{name}", str(exc)) from None
    return values


def parse_eviction_grace(key: str, raw: object) -> dict[str, float]:
    """Signal -> grace period in seconds (``evictionSoftGracePeriod``); the flag form is
    ``memory.available=1m30s,nodefs.available=2m``."""
    out: dict[str, float] = {}
    for name, value in _pairs(key, raw).items():
        if name not in EVICTION_SIGNALS:
            raise ConfigError(f"{key}.{name}", f"unknown eviction signal (one of "
                              f"{', '.join(EVICTION_SIGNALS)})")
        out[name] = parse_duration(f"{key}.{name}", value)
    return out


def parse_ip_list(key: str, raw: object) -> list[str]:
    """A list of IP addresses (``clusterDNS``): a YAML list, or comma-separated in a flag."""
    items = raw if isinstance(raw, list) else parse_str(key, raw).split(",")
    out = []
    for item in items:
        text = parse_str(key, item).strip()
        if not text:
            continue
        try:
            out.append(str(ipaddress.ip_address(text)))
        except ValueError:
            raise ConfigError(key, f"{text!r} is not an IP address") from None
    return out


def parse_node_ips(key: str, raw: object) -> str:
    """``''`` or one IP, or two of different families (dual-stack), comma-separated. The
    kubelet refuses unspecified, multicast and link-local addresses; a loopback address is
    accepted (a node on one machine, and the tests)."""
    text = parse_str(key, raw).strip()
    if not text:
        return ""
    ips = [p.strip() for p in text.split(",")]
    parsed = []
    for ip in ips:
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            raise ConfigError(key, f"{ip!r} is not an IP address") from None
        if addr.is_unspecified or addr.is_multicast or addr.is_link_local:
            raise ConfigError(key, f"{ip} cannot be a node IP (unspecified, multicast or "
                              "link-local)")
        parsed.append(addr)
    if len(parsed) > 2 or (len(parsed) == 2 and parsed[0].version == parsed[1].version):
        raise ConfigError(key, "at most two addresses, one IPv4 and one IPv6 (dual-stack)")
    return ",".join(str(a) for a in parsed)
