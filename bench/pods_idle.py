"""Idle CPU and memory sampling for bench/pods.py (not a test).

CPU: user+system seconds of each process (keyed by PID and create time) at the start and the
end of the window; a process born inside the window counts with all its CPU time, one that died
inside it is listed as lost. RSS: the largest sum seen over samples every `sample_every` seconds
(psutil `memory_info`, cheap). PSS (`memory_full_info`, reads smaps: costly) is taken once,
after the window, because RSS counts pages a forked process shares with its parent once per
process.
Resident together (`resident_mb`): the distinct physical pages resident in any process of the
group, read from /proc/PID/pagemap (page frame numbers need root; without them it is NaN). This
is what "RSS of all the processes together" means without counting a page once per process that
maps it (after a fork, parent and child share every page until one writes it).
"""

from __future__ import annotations

import array
import contextlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

Key = tuple[int, float]


@dataclass(frozen=True)
class Usage:
    label: str
    processes: int
    cpu_percent: float  # of one core, over the window
    rss_mb: float  # largest sum over the samples
    pss_mb: float  # after the window
    resident_mb: float  # distinct resident pages of the whole group, after the window
    lost: int  # processes that died inside the window
    details: tuple[str, ...] = ()  # one line per process

    def detail_lines(self) -> list[str]:
        return [f"      {line}" for line in self.details]

    def line(self) -> str:
        return (f"  {self.label:34s} {self.processes:4d} procs  CPU {self.cpu_percent:6.2f} %"
                f" of a core   RSS sum {self.rss_mb:7.1f} MB   resident together "
                f"{self.resident_mb:7.1f} MB   PSS {self.pss_mb:7.1f} MB"
                + (f"   ({self.lost} died in the window)" if self.lost else ""))


def _key(proc: psutil.Process) -> Key | None:
    try:
        return (proc.pid, proc.create_time())
    except psutil.Error:
        return None


def cpu_seconds(procs: list[psutil.Process]) -> dict[Key, float]:
    """User + system seconds of each process, keyed by (PID, create time)."""
    out: dict[Key, float] = {}
    for proc in procs:
        try:
            times = proc.cpu_times()
            key = _key(proc)
        except psutil.Error:
            continue
        if key is not None:
            out[key] = times.user + times.system
    return out


def thread_cpu(pid: int) -> dict[str, tuple[int, float]]:
    """Thread name -> (threads, seconds on a CPU), summed over the threads of that name, from
    each thread's schedstat (nanoseconds; /proc/PID/stat counts 10 ms ticks)."""
    out: dict[str, tuple[int, float]] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    name = f.read().strip()
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    ns = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            count, seconds = out.get(name, (0, 0.0))
            out[name] = (count + 1, seconds + ns / 1e9)
    return out


def _rss(procs: list[psutil.Process]) -> float:
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total / 2**20


def _pss(procs: list[psutil.Process]) -> float:
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error, AttributeError):
            total += proc.memory_full_info().pss
    return total / 2**20


_PAGE = os.sysconf("SC_PAGE_SIZE")
_PRESENT = 1 << 63
_PFN_MASK = (1 << 55) - 1


def _frames(pid: int) -> set[int]:
    """Page frame numbers of every resident page of `pid` (empty without root)."""
    frames: set[int] = set()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split(None, 1)[0].split("-"))
            if line.rstrip().endswith("[vsyscall]"):
                continue
            pagemap.seek(lo // _PAGE * 8)
            entries = array.array("Q")
            entries.frombytes(pagemap.read((hi - lo) // _PAGE * 8))
            frames.update(e & _PFN_MASK for e in entries if e & _PRESENT)
    return frames


def resident_mb(procs: list[psutil.Process]) -> float:
    """MB of distinct physical pages resident in `procs` together; NaN without root."""
    frames: set[int] = set()
    for proc in procs:
        with contextlib.suppress(OSError):
            frames |= _frames(proc.pid)
    frames.discard(0)  # PFNs read as 0 without CAP_SYS_ADMIN
    return len(frames) * _PAGE / 2**20 if frames else math.nan


Group = tuple[str, Callable[[], list[psutil.Process]]]


def measure_idle(groups: list[Group], seconds: float, sample_every: float = 5.0) -> list[Usage]:
    """Measure every group over the same window; the caller must not poll anything during it."""
    start = {label: cpu_seconds(list_procs()) for label, list_procs in groups}
    threads = {p.pid: thread_cpu(p.pid) for _, list_procs in groups for p in list_procs()}
    rss = {label: _rss(list_procs()) for label, list_procs in groups}
    t0 = time.monotonic()
    end = t0 + seconds
    while (now := time.monotonic()) < end:
        time.sleep(min(sample_every, end - now))
        for label, list_procs in groups:
            rss[label] = max(rss[label], _rss(list_procs()))
    wall = time.monotonic() - t0
    out = []
    for label, list_procs in groups:
        procs = list_procs()
        finish = cpu_seconds(procs)
        used = sum(cpu - start[label].get(key, 0.0) for key, cpu in finish.items())
        lost = sum(1 for key in start[label] if key not in finish)
        details = tuple(_detail(p, finish, start[label], wall, threads.get(p.pid, {}))
                        for p in procs)
        out.append(Usage(label, len(procs), 100.0 * used / wall, rss[label], _pss(procs),
                         resident_mb(procs), lost, details))
    return out


def _role(proc: psutil.Process) -> str:
    name = proc.name()
    if not name.startswith("python"):
        return name
    cmd = " ".join(proc.cmdline())
    for marker, role in (("forkserver", "forkserver"), ("runtime.zygote", "zygote")):
        if marker in cmd:
            parent = proc.parent()
            if role == "zygote" and parent and "runtime.zygote" in " ".join(parent.cmdline()):
                return "spare monitor (zygote child)"
            return role
    return cmd[:40]


def _detail(proc: psutil.Process, finish: dict[Key, float], start: dict[Key, float],
            wall: float, threads_before: dict[str, tuple[int, float]]) -> str:
    key = _key(proc)
    cpu = finish.get(key, 0.0) - start.get(key, 0.0) if key else 0.0
    try:
        name = _role(proc)
        rss = proc.memory_info().rss / 2**20
    except psutil.Error:
        return f"{proc.pid} (gone)"
    # where it went, by thread name (gRPC's event-engine threads, the main loop, pools)
    used = sorted(((seconds - threads_before.get(tname, (0, 0.0))[1], tname, count)
                   for tname, (count, seconds) in thread_cpu(proc.pid).items()), reverse=True)
    by_thread = ", ".join(f"{tname}{f' x{count}' if count > 1 else ''} "
                          f"{100.0 * seconds / wall:.3f}" for seconds, tname, count in used[:3]
                          if seconds > 0)
    return (f"{proc.pid:7d} {name:40s} CPU {100.0 * cpu / wall:5.2f} %   RSS {rss:6.1f} MB"
            + (f"   threads (%): {by_thread}" if by_thread else ""))
