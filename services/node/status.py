"""The Node object and its status, as the kubelet builds them (KUBELET.md, "API server
membership"): labels, taints and providerID at registration, addresses (``nodeIP`` when set),
capacity and allocatable (``common/allocatable.py``: less kubeReserved, systemReserved and the
hard eviction thresholds), nodeInfo (``kubeletVersion`` from ``version.py``), the runtime's
handlers (``runtimeHandlers``), daemonEndpoints and the four conditions. Pure: the machine's
facts and the runtime's answers come in as values, the time as a parameter, so the status is
computed and compared in tests without a machine or a clock.
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from podvisor.common.allocatable import allocatable, formatted

Obj = dict[str, Any]
ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le",
        "s390x": "s390x", "riscv64": "riscv64"}


@dataclass(frozen=True)
class MachineFacts:
    hostname: str
    internal_ip: str
    cpus: int
    memory_bytes: int
    ephemeral_storage_bytes: int
    machine_id: str
    system_uuid: str
    boot_id: str
    kernel_version: str
    os_image: str
    architecture: str


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _os_image() -> str:
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return "Linux"


def _memory_bytes() -> int:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def internal_ip(toward: str) -> str:
    """The address this machine uses to reach ``toward`` (a host name or IP): the InternalIP."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((toward or "8.8.8.8", 443))  # UDP connect: no packet is sent
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def machine_facts(root_dir: str, api_host: str) -> MachineFacts:
    try:
        st = os.statvfs(root_dir if os.path.exists(root_dir) else "/")
        storage = st.f_blocks * st.f_frsize
    except OSError:
        storage = 0
    return MachineFacts(
        hostname=socket.gethostname().lower(), internal_ip=internal_ip(api_host),
        cpus=os.cpu_count() or 1, memory_bytes=_memory_bytes(),
        ephemeral_storage_bytes=storage, machine_id=_read("/etc/machine-id"),
        system_uuid=_read("/sys/class/dmi/id/product_uuid").lower(),
        boot_id=_read("/proc/sys/kernel/random/boot_id"),
        kernel_version=platform.release(), os_image=_os_image(),
        architecture=ARCH.get(platform.machine(), platform.machine()))


@dataclass(frozen=True)
class RuntimeHandlerFacts:
    """One of the runtime's handlers as CRI Status lists it, with the features the Node shows
    (``NodeRuntimeHandlerFeatures``)."""

    name: str  # "" is the default handler
    recursive_read_only_mounts: bool = False
    user_namespaces: bool = False

    def to_node(self) -> Obj:
        """``status.runtimeHandlers[]`` as the kubelet's ``RuntimeHandlers`` setter writes it
        (both features always given)."""
        return {"name": self.name, "features": {
            "recursiveReadOnlyMounts": self.recursive_read_only_mounts,
            "userNamespaces": self.user_namespaces}}


@dataclass(frozen=True)
class RuntimeFacts:
    """What CRI says: ``name://version``, the Ready condition's reason ('' when ready) and the
    runtime's handlers."""

    version: str  # containerRuntimeVersion, '' when the runtime did not answer
    not_ready: str  # '' or e.g. "container runtime is down" / "network plugin not ready: ..."
    note: str = ""  # said after the Ready message, as the kubelet's ". AppArmor enabled"
    handlers: tuple[RuntimeHandlerFacts, ...] = ()


def keep_handlers(facts: RuntimeFacts, last: tuple[RuntimeHandlerFacts, ...]) -> RuntimeFacts:
    """``facts`` with the handlers the runtime last listed when it did not answer now: the
    Node keeps showing them while the runtime is down, as the kubelet's ``runtimeState`` keeps
    the last ones (and a status PATCH would not remove them anyway)."""
    return facts if facts.version else replace(facts, handlers=last)


@dataclass(frozen=True)
class NodeShape:
    """What the config says of the Node (KubeletConfiguration names in the comments)."""

    node_ips: tuple[str, ...] = ()  # nodeIP: the InternalIP(s); () = found toward the API
    labels: Mapping[str, str] = field(default_factory=dict)  # nodeLabels
    taints: Sequence[Mapping[str, str]] = ()  # registerWithTaints
    provider_id: str = ""  # providerID
    kube_reserved: Mapping[str, str] = field(default_factory=dict)
    system_reserved: Mapping[str, str] = field(default_factory=dict)
    eviction_hard: Mapping[str, str] = field(default_factory=dict)


def local_address(ip: str) -> bool:
    """Whether ``ip`` is an address of this host (the kubelet's ``validateNodeIP``: it must be
    on one of the host's interfaces)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def node_shape(config: Any) -> NodeShape:
    """The Node's settings from the agent's config; a ``nodeIP`` that is not this host's is
    refused with the kubelet's message (``ValueError``)."""
    ips = config.node_ips
    for ip in ips:
        if not local_address(ip):
            raise ValueError(f"failed to validate nodeIP: node IP: {ip!r} not found in the "
                             "host's network interfaces")
    return NodeShape(node_ips=ips, labels=dict(config.node_labels),
                     taints=[dict(t) for t in config.register_with_taints],
                     provider_id=config.provider_id, kube_reserved=dict(config.kube_reserved),
                     system_reserved=dict(config.system_reserved),
                     eviction_hard=dict(config.eviction_hard))


def default_labels(node: str, facts: MachineFacts) -> dict[str, str]:
    """The labels the kubelet sets itself and reconciles on an existing Node."""
    return {"kubernetes.io/hostname": node, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": facts.architecture,
            "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": facts.architecture}


def node_labels(node: str, facts: MachineFacts,
                extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The labels of a new Node: ``nodeLabels`` first, the kubelet's own ones win."""
    return {**(extra or {}), **default_labels(node, facts)}


def new_node(node: str, facts: MachineFacts, shape: NodeShape) -> Obj:
    """The Node POSTed at registration (kubelet ``initialNode``): labels, taints,
    providerID. Only at registration: the kubelet never reconciles these onto an existing
    Node (only its default labels)."""
    spec: Obj = {}
    if shape.taints:
        spec["taints"] = [dict(t) for t in shape.taints]
    if shape.provider_id:
        spec["providerID"] = shape.provider_id
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "labels": node_labels(node, facts, shape.labels)},
            **({"spec": spec} if spec else {})}


def capacity(facts: MachineFacts, max_pods: int) -> dict[str, Decimal]:
    return {"cpu": Decimal(facts.cpus), "memory": Decimal(facts.memory_bytes),
            "ephemeral-storage": Decimal(facts.ephemeral_storage_bytes),
            "pods": Decimal(max_pods)}


def quantities(facts: MachineFacts, max_pods: int,
               shape: NodeShape | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) in the API's form."""
    shape = shape or NodeShape()
    cap = capacity(facts, max_pods)
    alloc = allocatable(cap, shape.kube_reserved, shape.system_reserved, shape.eviction_hard)
    return formatted(cap), formatted(alloc)


def addresses(node: str, facts: MachineFacts, shape: NodeShape) -> list[Obj]:
    ips = shape.node_ips or (facts.internal_ip,)
    return [*({"type": "InternalIP", "address": ip} for ip in ips),
            {"type": "Hostname", "address": node}]


# condition -> (reason and message when True, when False) (nodestatus/setters.go)
PRESSURE_WORDS = {
    "MemoryPressure": (
        ("KubeletHasInsufficientMemory", "kubelet has insufficient memory available"),
        ("KubeletHasSufficientMemory", "kubelet has sufficient memory available")),
    "DiskPressure": (("KubeletHasDiskPressure", "kubelet has disk pressure"),
                     ("KubeletHasNoDiskPressure", "kubelet has no disk pressure")),
    "PIDPressure": (("KubeletHasInsufficientPID", "kubelet has insufficient PID available"),
                    ("KubeletHasSufficientPID", "kubelet has sufficient PID available")),
}
# condition -> the taint the node lifecycle controller puts on a Node with it (NoSchedule)
PRESSURE_TAINTS = {"MemoryPressure": "node.kubernetes.io/memory-pressure",
                   "DiskPressure": "node.kubernetes.io/disk-pressure",
                   "PIDPressure": "node.kubernetes.io/pid-pressure"}


def pressure_conditions(pressure: Sequence[str]) -> list[Obj]:
    """MemoryPressure, DiskPressure and PIDPressure: True for those in ``pressure`` (the
    eviction manager's), with the kubelet's reasons and messages."""
    out = []
    for ctype, (true, false) in PRESSURE_WORDS.items():
        on = ctype in pressure
        reason, message = true if on else false
        out.append({"type": ctype, "status": "True" if on else "False", "reason": reason,
                    "message": message})
    return out


def pressure_taints(taints: Sequence[Mapping[str, Any]], pressure: Sequence[str]) -> list[Obj]:
    """``taints`` with the pressure taints of ``pressure`` added (``NoSchedule``) and the others
    removed; every other taint kept as it is."""
    wanted = {PRESSURE_TAINTS[c] for c in pressure if c in PRESSURE_TAINTS}
    ours = set(PRESSURE_TAINTS.values())
    out = [dict(t) for t in taints
           if t.get("key") not in ours or (t.get("key") in wanted and
                                           t.get("effect") == "NoSchedule")]
    have = {t.get("key") for t in out}
    out += [{"key": k, "effect": "NoSchedule"} for k in sorted(wanted - have)]
    return out


def node_status(node: str, facts: MachineFacts, runtime: RuntimeFacts, *, max_pods: int,
                port: int, kubelet_version: str, shape: NodeShape | None = None,
                pressure: Sequence[str] = ()) -> Obj:
    """The status without times (conditions get them in ``with_times``). ``pressure``: the
    node conditions the eviction manager holds True."""
    shape = shape or NodeShape()
    cap, alloc = quantities(facts, max_pods, shape)
    ready = not runtime.not_ready
    handlers = {"runtimeHandlers": [h.to_node() for h in runtime.handlers]} \
        if runtime.handlers else {}  # an empty list is left out of the Node, as omitempty
    return {
        **handlers,
        "addresses": addresses(node, facts, shape),
        "capacity": cap, "allocatable": alloc,
        "nodeInfo": {"machineID": facts.machine_id, "systemUUID": facts.system_uuid,
                     "bootID": facts.boot_id, "kernelVersion": facts.kernel_version,
                     "osImage": facts.os_image,
                     "containerRuntimeVersion": runtime.version,
                     "kubeletVersion": kubelet_version, "kubeProxyVersion": "",
                     "operatingSystem": "linux", "architecture": facts.architecture},
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        "conditions": [
            *pressure_conditions(pressure),
            {"type": "Ready", "status": "True" if ready else "False",
             "reason": "KubeletReady" if ready else "KubeletNotReady",
             "message": _ready_message(runtime) if ready else runtime.not_ready},
        ],
    }


def _ready_message(runtime: RuntimeFacts) -> str:
    text = "kubelet is posting ready status"
    return f"{text}. {runtime.note}" if runtime.note else text


def with_times(status: Obj, previous: Obj | None, now: str) -> Obj:
    """``status`` with ``lastHeartbeatTime`` = now and ``lastTransitionTime`` kept from
    ``previous`` while a condition's status is unchanged."""
    before = {c["type"]: c for c in (previous or {}).get("conditions", [])}
    out = dict(status)
    conditions = []
    for c in status["conditions"]:
        old = before.get(c["type"])
        since = old["lastTransitionTime"] if old and old.get("status") == c["status"] and \
            old.get("lastTransitionTime") else now
        conditions.append({**c, "lastHeartbeatTime": now, "lastTransitionTime": since})
    out["conditions"] = conditions
    return out
