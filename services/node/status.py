"""The Node object and its status, as the kubelet builds them (KUBELET.md, "API server
membership"): labels, addresses, capacity/allocatable, nodeInfo, daemonEndpoints and the four
conditions. Pure: the machine's facts and the runtime's answers come in as values, the time as
a parameter, so the status is computed and compared in tests without a machine or a clock.
"""

from __future__ import annotations

import os
import platform
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le",
        "s390x": "s390x", "riscv64": "riscv64"}
KUBELET_VERSION = "v1.33.0-podvisor"  # the API version whose semantics podvisor follows


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
class RuntimeFacts:
    """What CRI says: ``name://version`` and the Ready condition's reason ('' when ready)."""

    version: str  # containerRuntimeVersion, '' when the runtime did not answer
    not_ready: str  # '' or e.g. "container runtime is down" / "network plugin not ready: ..."


def node_labels(node: str, facts: MachineFacts) -> dict[str, str]:
    return {"kubernetes.io/hostname": node, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": facts.architecture,
            "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": facts.architecture}


def quantities(facts: MachineFacts, max_pods: int) -> dict[str, str]:
    return {"cpu": str(facts.cpus), "memory": f"{facts.memory_bytes // 1024}Ki",
            "pods": str(max_pods),
            "ephemeral-storage": f"{facts.ephemeral_storage_bytes // 1024}Ki"}


def node_status(node: str, facts: MachineFacts, runtime: RuntimeFacts, *, max_pods: int,
                port: int) -> Obj:
    """The status without times (conditions get them in ``with_times``)."""
    q = quantities(facts, max_pods)
    ready = not runtime.not_ready
    return {
        "addresses": [{"type": "InternalIP", "address": facts.internal_ip},
                      {"type": "Hostname", "address": node}],
        "capacity": q, "allocatable": dict(q),
        "nodeInfo": {"machineID": facts.machine_id, "systemUUID": facts.system_uuid,
                     "bootID": facts.boot_id, "kernelVersion": facts.kernel_version,
                     "osImage": facts.os_image,
                     "containerRuntimeVersion": runtime.version,
                     "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "",
                     "operatingSystem": "linux", "architecture": facts.architecture},
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        "conditions": [
            {"type": "MemoryPressure", "status": "False",
             "reason": "KubeletHasSufficientMemory",
             "message": "kubelet has sufficient memory available"},
            {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure",
             "message": "kubelet has no disk pressure"},
            {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID",
             "message": "kubelet has sufficient PID available"},
            {"type": "Ready", "status": "True" if ready else "False",
             "reason": "KubeletReady" if ready else "KubeletNotReady",
             "message": "kubelet is posting ready status" if ready else runtime.not_ready},
        ],
    }


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
