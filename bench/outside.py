"""CPU and memory of process trees as seen from outside them (issue 30), not a test.

What an operator outside the agent would measure, and what the bench's idle and burst figures
now use, for podvisor and for every peer alike:
- CPU: utime + stime + cutime + cstime of every process of a group, from /proc/PID/stat, summed
  at each window's edges. cutime/cstime carry the CPU of children a member waited for (exec
  probes, `iptables`, `mount`, runc, a crashed subsystem the supervisor reaped), which the
  processes' own utime+stime miss. The group's sum moves by what the group spent: a child that
  exits inside a window leaves its ticks to its parent's cutime. A member whose reaper is outside
  the group (a containerd shim re-parented to init) takes its ticks with it when it exits; such
  exits are counted (`gone`) and printed, never silently dropped.
- Memory: PSS (proportional set size) from /proc/PID/smaps_rollup, summed over the group: a
  page shared by n processes counts 1/n to each, so a group's sum counts each of its pages once
  (pages shared with processes outside the group count in part).
- Several windows, each a sample: a figure is their median with their range (min-max), and a
  comparison is the ratio of two groups' medians measured over the same windows, never a bare
  percentage (the absolute figures move 4-5x with the host's load; same-run ratios hold).

A group is a label and a selector: a function from one /proc snapshot (pid -> Stat) to the
group's PIDs, re-evaluated at every edge (processes come and go). `tree()` selects a process and
its descendants, minus pruned subtrees (the pods' own processes: the workload, not the agent).
The /proc root, the clock and the sleep are parameters (tests use a fake /proc and a fake clock).
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Stat:
    """The fields of /proc/PID/stat the bench reads."""

    pid: int
    ppid: int
    comm: str
    state: str
    ticks: int  # utime + stime + cutime + cstime, in clock ticks
    start: int  # starttime (ticks after boot): with the PID, a process's identity
    own: int = 0  # utime + stime alone (a thread's figure: cutime/cstime are its process's)

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.start)


def parse_stat(text: str) -> Stat:
    """One /proc/PID/stat line. comm is between the first '(' and the LAST ')' (it may hold
    spaces and parentheses); fields 14-17 are utime stime cutime cstime, 22 starttime."""
    left, right = text.index("("), text.rindex(")")
    pid = int(text[:left])
    rest = text[right + 2:].split()  # rest[0] is field 3 (state)
    utime, stime, cutime, cstime = (int(x) for x in rest[11:15])
    return Stat(pid, int(rest[1]), text[left + 1:right], rest[0],
                utime + stime + cutime + cstime, int(rest[19]), utime + stime)


class Proc:
    """Reads a /proc tree (the real one, or a test's copy)."""

    def __init__(self, root: Path = Path("/proc")) -> None:
        self.root = root

    def stats(self) -> dict[int, Stat]:
        out: dict[int, Stat] = {}
        for entry in os.scandir(self.root):
            if not entry.name.isdigit():
                continue
            try:
                stat = parse_stat((self.root / entry.name / "stat").read_text())
            except (OSError, ValueError, IndexError):
                continue  # exited between listing and reading
            out[stat.pid] = stat  # a zombie keeps its ticks until reaped into cutime
        return out

    def pss_kb(self, pid: int) -> int:
        """Pss of /proc/PID/smaps_rollup in kB; 0 when the process is gone (or a kernel
        thread: no mappings)."""
        try:
            for line in (self.root / str(pid) / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    return int(line.split()[1])
        except (OSError, ValueError, IndexError):
            pass
        return 0

    def pss_parts(self, pid: int) -> dict[str, int]:
        """Every Pss* line of /proc/PID/smaps_rollup in kB (Pss, Pss_Anon, Pss_File,
        Pss_Shmem, ...): what of a process's share is its own heap and what mapped files."""
        out: dict[str, int] = {}
        try:
            for line in (self.root / str(pid) / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss"):
                    name, value = line.split(":", 1)
                    out[name] = int(value.split()[0])
        except (OSError, ValueError, IndexError):
            pass
        return out

    def threads(self, pid: int) -> dict[str, tuple[int, int]]:
        """Thread name -> (threads of that name, their utime + stime ticks summed), from
        /proc/PID/task/*/stat."""
        out: dict[str, tuple[int, int]] = {}
        try:
            tids = os.listdir(self.root / str(pid) / "task")
        except OSError:
            return out
        for tid in tids:
            try:
                stat = parse_stat((self.root / str(pid) / "task" / tid / "stat").read_text())
            except (OSError, ValueError, IndexError):
                continue
            count, ticks = out.get(stat.comm, (0, 0))
            out[stat.comm] = (count + 1, ticks + stat.own)
        return out

    def cmdline(self, pid: int) -> list[str]:
        try:
            raw = (self.root / str(pid) / "cmdline").read_bytes()
        except OSError:
            return []
        return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def children_of(stats: dict[int, Stat]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for stat in stats.values():
        out.setdefault(stat.ppid, []).append(stat.pid)
    return out


def tree(stats: dict[int, Stat], roots: Iterable[int], prune: Collection[int] = ()) -> set[int]:
    """The roots alive in `stats` and all their descendants, minus each pruned PID and its
    descendants."""
    kids = children_of(stats)
    out: set[int] = set()
    todo = [pid for pid in roots if pid in stats and pid not in prune]
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.add(pid)
        todo.extend(kid for kid in kids.get(pid, ()) if kid not in prune)
    return out


Selector = Callable[[dict[int, Stat]], set[int]]


@dataclass(frozen=True)
class Group:
    label: str
    select: Selector


def tree_selector(root: Callable[[], Iterable[int]],
                  prune: Callable[[], Collection[int]] = lambda: ()) -> Selector:
    """The descendants of the PIDs `root()` names, minus the subtrees of `prune()`'s (both
    asked at every edge)."""
    return lambda stats: tree(stats, root(), set(prune()))


def containerd_selector(socket_path: str, daemon_pid: Callable[[], int | None],
                        proc: Proc | None = None) -> Selector:
    """A containerd instance: its daemon's tree and the shims serving its socket (`-address
    <socket_path>`; they re-parent to init or a subreaper, away from the daemon). Not the
    shims' children: those are the pods' own processes (pause, the containers), the workload;
    the runc runs a shim waits for land in its cutime."""
    reader = proc or Proc()

    def select(stats: dict[int, Stat]) -> set[int]:
        pid = daemon_pid()
        out = tree(stats, [pid]) if pid else set()
        for stat in stats.values():
            if stat.comm.startswith("containerd-shim"):
                argv = reader.cmdline(stat.pid)
                if ("-address", socket_path) in itertools.pairwise(argv):
                    out.add(stat.pid)
        return out
    return select


@dataclass
class Figures:
    """One group over the windows: a sample per window."""

    label: str
    cpu_pct: list[float] = field(default_factory=list)  # % of one core, per window
    pss_mb: list[float] = field(default_factory=list)  # at each window's end
    procs: list[int] = field(default_factory=list)  # members at each window's end
    gone: int = 0  # members that exited inside a window with their reaper outside the group
    by_process: list[tuple[str, float, float]] = field(default_factory=list)
    # (name, % of a core over all the windows, PSS MB at the end), largest CPU first

    def as_json(self) -> dict[str, Any]:
        return {"cpu_pct": self.cpu_pct, "pss_mb": self.pss_mb, "procs": self.procs,
                "gone": self.gone, "by_process": [list(p) for p in self.by_process]}


@dataclass(frozen=True)
class _Edge:
    at: float
    stats: dict[int, Stat]
    members: dict[str, set[int]]


def _ticks(edge: _Edge, label: str) -> int:
    return sum(edge.stats[pid].ticks for pid in edge.members[label])


def _gone(before: _Edge, after: _Edge, label: str) -> int:
    """Members at `before` that exited by `after` and whose parent (their reaper, unless they
    were re-parented) is not a member at `after`: their ticks left the group's sum."""
    members_after = after.members[label]
    count = 0
    for pid in before.members[label]:
        old = before.stats[pid]
        now = after.stats.get(pid)
        if (now is None or now.key != old.key) and old.ppid not in members_after:
            count += 1
    return count


def name_of(proc: Proc, stat: Stat) -> str:
    """A readable name: comm, or for a Python process its module or script (`-m x` / x.py) and
    for podvisor's subsystems the `pv-<name>` comm they set."""
    if not stat.comm.startswith("python"):
        return stat.comm
    argv = proc.cmdline(stat.pid)
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m":
            return argv[i + 1]
    scripts = [a for a in argv[1:] if a.endswith(".py") or "/bin/" in a]
    return Path(scripts[0]).name if scripts else stat.comm


def measure(groups: list[Group], windows: int, seconds: float, proc: Proc | None = None,
            clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep, top: int = 12) -> dict[str, Figures]:
    """Every group over the same `windows` consecutive windows of `seconds` each. One /proc
    snapshot per edge serves every group; PSS is read at each window's end (smaps_rollup walks
    a process's page tables: a cost to the kernel, paid by this process, not by the groups)."""
    proc = proc or Proc()

    def edge() -> _Edge:
        stats = proc.stats()
        return _Edge(clock(), stats, {g.label: g.select(stats) for g in groups})

    out = {g.label: Figures(g.label) for g in groups}
    first = last = edge()
    for _ in range(windows):
        sleep(max(0.0, last.at + seconds - clock()))
        now = edge()
        wall = now.at - last.at
        for g in groups:
            fig = out[g.label]
            fig.cpu_pct.append(100.0 * (_ticks(now, g.label) - _ticks(last, g.label))
                               / CLK_TCK / wall if wall > 0 else 0.0)
            fig.pss_mb.append(sum(proc.pss_kb(pid) for pid in now.members[g.label]) / 1024)
            fig.procs.append(len(now.members[g.label]))
            fig.gone += _gone(last, now, g.label)
        last = now
    wall = last.at - first.at
    for g in groups:
        rows = []
        for pid in last.members[g.label]:
            stat = last.stats[pid]
            before = first.stats.get(pid)
            spent = stat.ticks - (before.ticks if before and before.key == stat.key else 0)
            rows.append((name_of(proc, stat), 100.0 * spent / CLK_TCK / wall if wall > 0 else 0.0,
                         proc.pss_kb(pid) / 1024))
        out[g.label].by_process = sorted(rows, key=lambda r: (-r[1], -r[2]))[:top]
    return out


@dataclass(frozen=True)
class Spread:
    median: float
    lo: float
    hi: float
    n: int

    def __str__(self) -> str:
        fmt = "{:.0f}" if self.median >= 100 else "{:.1f}" if self.median >= 1 else "{:.2f}"
        return f"{fmt.format(self.median)} ({fmt.format(self.lo)}-{fmt.format(self.hi)})"


def spread(samples: list[float]) -> Spread | None:
    if not samples:
        return None
    return Spread(statistics.median(samples), min(samples), max(samples), len(samples))


def ratio(ours: list[float], theirs: list[float]) -> float | None:
    """Median over median; None without both, or when the peer's median is 0 (an idle CPU
    below the clock's tick over the window)."""
    if not ours or not theirs:
        return None
    base = statistics.median(theirs)
    return statistics.median(ours) / base if base > 0 else None


def report(figures: dict[str, Figures], peer: str | None = None) -> list[str]:
    """Readable lines: each group's CPU and PSS (median and range), its ratio to `peer`'s, and
    its largest processes."""
    lines = []
    base = figures.get(peer) if peer else None
    for fig in figures.values():
        cpu, pss = spread(fig.cpu_pct), spread(fig.pss_mb)
        line = (f"  {fig.label:42s} CPU {cpu} % of a core   PSS {pss} MB   "
                f"{max(fig.procs, default=0)} procs")
        if base is not None and fig is not base:
            cr, mr = ratio(fig.cpu_pct, base.cpu_pct), ratio(fig.pss_mb, base.pss_mb)
            line += (f"   vs {base.label}: CPU {'-' if cr is None else f'{cr:.2f}x'}, "
                     f"PSS {'-' if mr is None else f'{mr:.2f}x'}")
        if fig.gone:
            line += f"   ({fig.gone} exited with their reaper outside the group: not counted)"
        lines.append(line)
        lines += [f"      {name:36s} CPU {c:6.2f} %   PSS {p:6.1f} MB"
                  for name, c, p in fig.by_process if c > 0 or p >= 1]
    return lines


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"
