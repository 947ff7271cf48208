"""A container's ``oom_score_adj`` (CRI ``LinuxContainerResources.oom_score_adj``).

Lowering a process's ``oom_score_adj`` needs CAP_SYS_RESOURCE. Without it (these VMs), the
value is clamped as containerd's ``restrict_oom_score_adj`` does: never below the runtime's
own current value (``restrict``). Pure helpers plus ``apply`` (a write to /proc).
"""

from __future__ import annotations

from pathlib import Path

CAP_SYS_RESOURCE = 24
MIN, MAX = -1000, 1000


def can_lower(proc_status: str) -> bool:
    """True when the ``CapEff`` of a /proc/<pid>/status text holds CAP_SYS_RESOURCE."""
    for line in proc_status.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    return False


def restrict(preferred: int, current: int) -> int:
    """containerd's ``restrictOOMScoreAdj``: the preferred value, but not below ``current``."""
    return max(preferred, current)


def effective(preferred: int, current: int, lowering_allowed: bool) -> int:
    """What the container gets: ``preferred`` within [-1000, 1000], clamped by ``restrict``
    unless this process may lower it."""
    value = min(MAX, max(MIN, preferred))
    return value if lowering_allowed else restrict(value, current)


def own_state(proc: Path = Path("/proc/self")) -> tuple[int, bool]:
    """This process's ``oom_score_adj`` and whether it may lower one."""
    try:
        current = int((proc / "oom_score_adj").read_text().strip())
        status = (proc / "status").read_text()
    except (OSError, ValueError):
        return 0, False
    return current, can_lower(status)


def apply(pid: int, value: int) -> None:
    """Write ``value`` to the process's ``oom_score_adj``. Raises OSError."""
    Path(f"/proc/{pid}/oom_score_adj").write_text(f"{value}\n")
