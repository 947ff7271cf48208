"""The node's pressure conditions, from the kubelet's default hard eviction thresholds (pure).

The kubelet's eviction manager sets MemoryPressure when ``memory.available`` < 100Mi,
DiskPressure when ``nodefs.available`` < 10 % or ``nodefs.inodesFree`` < 5 % (podvisor's
nodefs is the file system of ``rootDir``), PIDPressure when the free PIDs fall under a
configured threshold (none by default: here, under 5 % of ``pid_max``). ``conditions`` takes
the readings as a value (``NodeReadings``) and says each one with the signal that set it;
the sampler reads them (``/proc/meminfo``, ``statvfs``, ``/proc/loadavg``, ``pid_max``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["NodeReadings", "conditions"]

MEMORY_AVAILABLE_MIN = 100 << 20
NODEFS_AVAILABLE_MIN = 0.10
NODEFS_INODES_MIN = 0.05
PIDS_FREE_MIN = 0.05


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


def conditions(r: NodeReadings) -> list[dict[str, Any]]:
    """``[{"type", "status": "True"|"False", "reason", "message"}]`` for MemoryPressure,
    DiskPressure and PIDPressure."""
    out = []
    mem = r.mem_total > 0 and r.mem_available < MEMORY_AVAILABLE_MIN
    out.append({"type": "MemoryPressure", "status": str(mem),
                "reason": "KubeletHasInsufficientMemory" if mem else "KubeletHasSufficientMemory",
                "message": f"memory.available {r.mem_available >> 20}Mi (threshold 100Mi)"})
    fs = r.fs_size > 0 and r.fs_available < NODEFS_AVAILABLE_MIN * r.fs_size
    inodes = r.inodes > 0 and r.inodes_free < NODEFS_INODES_MIN * r.inodes
    disk = fs or inodes
    pct = 100 * r.fs_available // r.fs_size if r.fs_size else 100
    out.append({"type": "DiskPressure", "status": str(disk),
                "reason": "KubeletHasDiskPressure" if disk else "KubeletHasNoDiskPressure",
                "message": f"nodefs.available {pct}% (threshold 10%)"
                + (", nodefs.inodesFree under 5%" if inodes else "")})
    pid = r.pid_max > 0 and r.pid_max - r.pids < PIDS_FREE_MIN * r.pid_max
    out.append({"type": "PIDPressure", "status": str(pid),
                "reason": "KubeletHasInsufficientPID" if pid else "KubeletHasSufficientPID",
                "message": f"{r.pids} of {r.pid_max} PIDs in use"})
    return out
