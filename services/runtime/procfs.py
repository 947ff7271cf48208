"""Small /proc helpers: process identity (pid + start time) and process-group membership.

A pid alone is not an identity (pids are reused); a (pid, start ticks) pair is. Start ticks are
field 22 of /proc/<pid>/stat (clock ticks since boot).
"""

from __future__ import annotations

import os
import signal

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    return raw[raw.rfind(")") + 2:].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when it does not exist."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    return int(fields[19])  # field 22 overall; fields[0] is field 3 (state)


def is_alive(pid: int, ticks: int) -> bool:
    """True when ``pid`` still names the process that started at ``ticks`` and is not a zombie."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return False
    return int(fields[19]) == ticks and fields[0] not in ("Z", "X")


def group_members() -> dict[int, list[int]]:
    """Every live process keyed by its process group: one pass over /proc."""
    groups: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields is None or len(fields) < 3 or fields[0] in ("Z", "X"):
            continue
        groups.setdefault(int(fields[2]), []).append(int(name))
    return groups


def signal_group(pgid: int, ticks: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid`` if its leader is still the process we started.

    When the leader has exited, the group may still have members; they are signalled only when
    some member exists (killpg on an empty group fails with ESRCH, which is fine).
    Returns False when nothing was signalled.
    """
    leader_alive = is_alive(pgid, ticks)
    if not leader_alive and start_ticks(pgid) is not None:
        return False  # the pid was reused by an unrelated process; never signal it
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def signal_number(name_or_num: int) -> int:
    """Validate a signal number; 0 (unset) maps to SIGTERM."""
    return name_or_num if name_or_num > 0 else int(signal.SIGTERM)
