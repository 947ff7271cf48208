"""The node's pressure conditions on the dashboard, as the Node reports them (pure).

Whether MemoryPressure, DiskPressure or PIDPressure is True is the eviction manager's word (its
``pressure`` map: the thresholds configured in ``evictionHard``/``evictionSoft`` met, held for
``evictionPressureTransitionPeriod``), the same the node process puts in the Node's conditions;
no map value (eviction not running) is no pressure, as for the Node. Beside each, the readings
the sampler takes (``/proc/meminfo``, ``statvfs`` of ``rootDir``, ``/proc/loadavg``,
``pid_max``) say where the node stands. ``conditions`` takes both as values.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

__all__ = ["NodeReadings", "conditions"]


@dataclass(frozen=True)
class NodeReadings:
    mem_available: int  # bytes (MemAvailable)
    mem_total: int
    fs_available: int  # bytes of rootDir's file system available to unprivileged users
    fs_size: int
    inodes_free: int
    inodes: int
    pids: int  # processes now (/proc/loadavg's fourth field's denominator)
    pid_max: int


def conditions(r: NodeReadings, held: Collection[str]) -> list[dict[str, Any]]:
    """``[{"type", "status": "True"|"False", "reason", "message"}]`` for MemoryPressure,
    DiskPressure and PIDPressure: True for those in ``held`` (the eviction manager's), the
    kubelet's reasons, the readings as the message."""
    mem, disk, pid = ("MemoryPressure" in held, "DiskPressure" in held, "PIDPressure" in held)
    fs_pct = 100 * r.fs_available // r.fs_size if r.fs_size else 100
    inode_pct = 100 * r.inodes_free // r.inodes if r.inodes else 100
    return [
        {"type": "MemoryPressure", "status": str(mem),
         "reason": "KubeletHasInsufficientMemory" if mem else "KubeletHasSufficientMemory",
         "message": f"memory.available {r.mem_available >> 20}Mi of {r.mem_total >> 20}Mi"},
        {"type": "DiskPressure", "status": str(disk),
         "reason": "KubeletHasDiskPressure" if disk else "KubeletHasNoDiskPressure",
         "message": f"nodefs.available {fs_pct}%, nodefs.inodesFree {inode_pct}%"},
        {"type": "PIDPressure", "status": str(pid),
         "reason": "KubeletHasInsufficientPID" if pid else "KubeletHasSufficientPID",
         "message": f"{r.pids} of {r.pid_max} PIDs in use"},
    ]
