"""Admission before a pod's first sync (the kubelet's canAdmitPod, narrowed).

Pure: ``admit(pod, admitted_pods)`` returns None or the rejection (reason, message). A rejected
pod never starts; its ``desired`` entry says ``admitted: false`` and status reports phase Failed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from podvisor.services.pod import Pod
from podvisor.services.syncloop.cri_config import host_ports


@dataclass(frozen=True)
class Rejection:
    reason: str
    message: str


def _port_conflicts(pod: Pod, others: Iterable[Pod]) -> list[str]:
    mine = set(host_ports(pod))
    if not mine:  # most pods: no need to look at the others (O(pods) per admission)
        return []
    hits = []
    for other in others:
        if other.uid == pod.uid:
            continue
        for proto, port in sorted(mine & set(host_ports(other))):
            hits.append(f"{port}/{proto} (used by {other.full_name})")
    return hits


def _duplicate_ports(pod: Pod) -> list[str]:
    seen: set[tuple[str, int]] = set()
    dups = []
    for key in host_ports(pod):
        if key in seen:
            dups.append(f"{key[1]}/{key[0]}")
        seen.add(key)
    return dups


def admit(pod: Pod, admitted: Iterable[Pod]) -> Rejection | None:
    """Check ``pod`` against the pods already admitted on this node."""
    if not pod.spec.containers:
        return Rejection("UnsupportedPod", "the pod has no containers")
    if dups := _duplicate_ports(pod):
        return Rejection("HostPortConflict",
                         f"the pod claims host port(s) more than once: {', '.join(dups)}")
    if conflicts := _port_conflicts(pod, admitted):
        return Rejection("HostPortConflict",
                         "host port(s) already in use on this node: " + ", ".join(conflicts))
    return None
