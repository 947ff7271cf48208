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


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_NS_PER_TICK = 1_000_000_000 // CLOCK_TICKS


class GroupScanner:
    """CPU (user + system, ns) and resident memory (bytes) summed over the live members of
    process groups: one pass over /proc per ``usage()``, reading ``/proc/<pid>/stat`` (fields
    14, 15 and 24): user and system time as psutil's ``cpu_times``, and the resident pages
    ``stat`` reports, without a ``Process`` object and two more reads per member. (Since Linux
    6.2 ``stat``'s rss sums the per-CPU counters without their pending deltas, as ``top``
    shows it: it may be below ``statm``'s exact figure, which psutil reads, by up to
    3 x CPUs x max(32, 2 x CPUs) pages per process, 768 KiB on 2 CPUs; reading ``statm`` too
    would double the syscalls of a scrape.)

    Each process's group is remembered: a process seen outside every wanted group in the
    previous pass (and listed ever since) is not read again. Members are always read (their
    figures change, and a member that left its group is seen leaving), and so is every group's
    leader (it may have been seen in its parent's group before its ``setsid``: a container's
    process is forked by its monitor, then leaves the monitor's group). A process that joins a
    wanted group later (``setpgid``), or a pid reused between two passes, is read at the next
    full pass: every ``full_every`` seconds of ``now`` (any clock; a step back also makes one).
    A new container's processes are new pids, read on first sight. Not thread-safe."""

    def __init__(self, full_every: float = 30.0) -> None:
        self._full_every = full_every
        self._pgid: dict[str, int] = {}  # pid (its /proc name) -> its group when last read
        self._last_full: float | None = None

    def usage(self, pgids: set[int], now: float) -> dict[int, tuple[int, int]]:
        full = self._last_full is None or not 0 <= now - self._last_full < self._full_every
        if full:
            self._last_full = now
        known = self._pgid
        leaders = {str(p) for p in pgids}  # always read: a leader may have been seen before
        # its setsid (a container's process is forked in its monitor's group)
        seen: dict[str, int] = {}
        out: dict[int, tuple[int, int]] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pgid = known.get(name)
            if not full and pgid is not None and pgid not in pgids and name not in leaders:
                seen[name] = pgid  # outside every wanted group last time: not read again
                continue
            raw = _read(f"/proc/{name}/stat")  # (no buffered file object per process)
            # comm (field 2) may hold spaces and parentheses: split after the last ')'
            fields = raw[raw.rfind(b")") + 2:].split()
            if len(fields) < 22:
                continue
            pgid = int(fields[2])
            seen[name] = pgid
            if pgid not in pgids or fields[0] in (b"Z", b"X"):
                continue
            cpu, rss = out.get(pgid, (0, 0))
            out[pgid] = (cpu + (int(fields[11]) + int(fields[12])) * _NS_PER_TICK,
                         rss + int(fields[21]) * PAGE_SIZE)
        self._pgid = seen  # pids no longer listed are forgotten
        return out


def _read(path: str) -> bytes:
    """A small /proc file's bytes (b"" when the process is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return b""
    try:
        return os.read(fd, 4096)
    except OSError:
        return b""
    finally:
        os.close(fd)


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
