"""Container cgroups of the embedded runtime, on cgroup v1 and v2, as runc makes them.

A container whose ``LinuxContainerResources`` ask for something (memory limit, CPU shares, CPU
quota, ``unified`` keys) gets a cgroup ``<cgroup_parent>/<container id>`` (the sandbox's
``linux.cgroup_parent``, which the sync loop sets to ``<cgroupRoot>/pod<uid>``; the runtime's
``DEFAULT_PARENT`` when it is empty) on every hierarchy it needs: on cgroup v1 memory and
cpuacct always (OOM kills, stats), cpu and pids when it limits them; on v2 the unified one (the
needed controllers enabled down the path). The limits are written at CreateContainer, so what
the host cannot do fails the create; the container's process joins the cgroup in the monitor's
child BEFORE it execs the command (monitor.c ``join_cgroups``, monitor.py ``_fork_exec``; the
files it writes: ``join_files``), so even its first allocation is counted. A container without
resources and no pod cgroup gets no cgroup (and costs nothing more).

What is written (the runc conversions):
  v1  memory.limit_in_bytes (+ memory.memsw.limit_in_bytes = the swap limit or the memory limit,
      when the kernel accounts swap), cpu.shares, cpu.cfs_period_us + cpu.cfs_quota_us,
      pids.max (``unified["pids.max"]``: CRI has no pids field)
  v2  memory.max, memory.swap.max (swap - memory), cpu.weight (from shares), cpu.max,
      and the ``unified`` keys in ``UNIFIED_KEYS``
Refused (FAILED_PRECONDITION, the message names the field and the reason): hugepage limits,
cpusets, ``unified`` keys outside ``UNIFIED_KEYS`` (on v1 anything but pids.max), a controller
that is not mounted, and a cgroup that cannot be created or written (not root, read-only
cgroupfs). Never silently ignored. A container that asks for nothing in a sandbox with a
``cgroup_parent`` (a pod cgroup under ``cgroupRoot``) gets accounting folders only (memory and
cpuacct; best effort), so the pod's usage shows in its cgroup as under the kubelet.

``Layout`` says where each hierarchy is; ``host_layout()`` reads /proc/self/mountinfo, and
tests build one over a temp dir (every effect is a plain file operation under its paths).
Thread-safe: no state besides the immutable layout.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cri_api.v1 import api_pb2 as pb

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.services.runtime.faults import Fault, invalid, precondition

V1_CONTROLLERS = ("memory", "cpu", "cpuacct", "pids")
UNIFIED = "unified"  # the key of the v2 folder in a container's ``dirs``
DEFAULT_PARENT = "/podvisor-embedded"  # for sandboxes without a cgroup_parent
CPU_PERIOD = 100_000  # microseconds, runc's default and the kubelet's
MAX_SHARES = 262_144
UNIFIED_KEYS = frozenset({"pids.max", "memory.max", "memory.high", "memory.swap.max",
                          "cpu.max", "cpu.weight"})
REMOVE_WAIT = 2.0  # seconds to wait for killed leftovers before rmdir gives up


@dataclass(frozen=True)
class Layout:
    """Where the hierarchies are. ``version`` 1: ``mounts`` maps each mounted v1 controller
    among ``V1_CONTROLLERS`` to its mount point; 2: ``{"unified": mount point}`` and
    ``v2_controllers`` what its root offers; 0: no cgroups (``why`` says so)."""

    version: int
    mounts: Mapping[str, str] = field(default_factory=dict)
    roots: Mapping[str, str] = field(default_factory=dict)  # hierarchy folder shown at the mount
    v2_controllers: frozenset[str] = frozenset()
    why: str = ""


@dataclass(frozen=True)
class Write:
    controller: str  # v1 controller, or "unified"
    file: str
    value: str
    optional: bool = False  # skipped when the file does not exist (e.g. memsw without swap)


@dataclass(frozen=True)
class Usage:
    cpu_ns: int
    memory_bytes: int
    working_set_bytes: int
    rss_bytes: int


def parse_mountinfo(text: str) -> Layout:
    """The layout of a /proc/self/mountinfo text: v1 when any of ``V1_CONTROLLERS`` is on a v1
    hierarchy (a hybrid host's controllers are there, its v2 mount has none), else v2."""
    v1: dict[str, str] = {}
    roots: dict[str, str] = {}
    v2 = ""
    v2_root = "/"
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        mount = fields[4].replace("\\040", " ")
        if tail[0] == "cgroup":
            for opt in tail[2].split(","):
                if opt in V1_CONTROLLERS and opt not in v1:
                    v1[opt], roots[opt] = mount, fields[3]
        elif tail[0] == "cgroup2" and not v2:
            v2, v2_root = mount, fields[3]
    if v1:
        return Layout(1, v1, roots)
    if v2:
        try:
            with open(os.path.join(v2, "cgroup.controllers")) as f:
                controllers = frozenset(f.read().split())
        except OSError:
            controllers = frozenset()
        return Layout(2, {UNIFIED: v2}, {UNIFIED: v2_root}, controllers)
    return Layout(0, why="no cgroup hierarchy is mounted on this host")


def host_layout() -> Layout:
    try:
        with open("/proc/self/mountinfo") as f:
            return parse_mountinfo(f.read())
    except OSError as err:
        return Layout(0, why=f"cannot read /proc/self/mountinfo: {err.strerror}")


# --- the arithmetic (pure) ---------------------------------------------------------------------

def shares_to_weight(shares: int) -> int:
    """runc's cpu.shares -> cpu.weight conversion ([2, 262144] -> [1, 10000])."""
    if shares <= 0:
        return 0
    return max(1, min(10_000, 1 + ((shares - 2) * 9999) // 262_142))


def plan(res: pb.LinuxContainerResources, version: int) -> list[Write]:
    """The writes that apply ``res`` on cgroup ``version`` (1 or 2), in order; [] when it asks
    for nothing. Raises ``Fault`` (FAILED_PRECONDITION) for what cannot be honoured."""
    if res.hugepage_limits:
        sizes = ", ".join(h.page_size for h in res.hugepage_limits)
        raise precondition(f"hugepage limits ({sizes}) are not supported by the embedded "
                           "runtime (no hugetlb cgroup support)")
    if res.cpuset_cpus or res.cpuset_mems:
        raise precondition("cpusets (cpuset_cpus/cpuset_mems) are not supported by the "
                           "embedded runtime")
    out = _plan_v1(res) if version == 1 else _plan_v2(res)
    for key in sorted(res.unified):
        value = res.unified[key]
        if key not in UNIFIED_KEYS or (version == 1 and key != "pids.max"):
            on = "on cgroup v1 only pids.max is" if version == 1 else \
                f"supported: {', '.join(sorted(UNIFIED_KEYS))}"
            raise precondition(f"unified cgroup setting {key!r} is not supported by the "
                               f"embedded runtime ({on})")
        if not value or "\n" in value or len(value) > 64:
            raise invalid(f"unified cgroup setting {key!r}: bad value {value[:64]!r}")
        controller = "pids" if version == 1 else UNIFIED
        out.append(Write(controller, key, value))
    return out


def _memory_limit(res: pb.LinuxContainerResources) -> int:
    if res.memory_limit_in_bytes < 0:
        raise invalid(f"memory limit {res.memory_limit_in_bytes} is negative")
    if 0 < res.memory_limit_in_bytes < 4096:
        raise invalid(f"memory limit {res.memory_limit_in_bytes} bytes is below one page")
    return res.memory_limit_in_bytes


def _plan_v1(res: pb.LinuxContainerResources) -> list[Write]:
    out: list[Write] = []
    memory = _memory_limit(res)
    if memory:
        swap = res.memory_swap_limit_in_bytes or memory
        out.append(Write("memory", "memory.limit_in_bytes", str(memory)))
        out.append(Write("memory", "memory.memsw.limit_in_bytes", str(swap), optional=True))
    if res.cpu_shares:
        out.append(Write("cpu", "cpu.shares", str(max(2, min(res.cpu_shares, MAX_SHARES)))))
    if res.cpu_quota:
        out.append(Write("cpu", "cpu.cfs_period_us", str(res.cpu_period or CPU_PERIOD)))
        out.append(Write("cpu", "cpu.cfs_quota_us", str(res.cpu_quota if res.cpu_quota > 0
                                                          else -1)))
    return out


def _plan_v2(res: pb.LinuxContainerResources) -> list[Write]:
    out: list[Write] = []
    memory = _memory_limit(res)
    if memory:
        out.append(Write(UNIFIED, "memory.max", str(memory)))
        swap = res.memory_swap_limit_in_bytes
        if swap:
            out.append(Write(UNIFIED, "memory.swap.max",
                             "max" if swap < 0 else str(max(0, swap - memory)), optional=True))
    if res.cpu_shares:
        out.append(Write(UNIFIED, "cpu.weight", str(shares_to_weight(res.cpu_shares))))
    if res.cpu_quota:
        quota = "max" if res.cpu_quota < 0 else str(res.cpu_quota)
        out.append(Write(UNIFIED, "cpu.max", f"{quota} {res.cpu_period or CPU_PERIOD}"))
    return out


def _v2_controller(file: str) -> str:
    return file.split(".", 1)[0]


# --- the effects ---------------------------------------------------------------------------------

class Cgroups:
    """Creates, updates, reads and removes container cgroups in a ``Layout``."""

    def __init__(self, layout: Layout, sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = SYSTEM_CLOCK.monotonic) -> None:
        self.layout = layout
        self._sleep = sleep
        self._monotonic = monotonic

    def dirs_for(self, cgroup_path: str) -> dict[str, str]:
        """controller (or "unified") -> the folder of ``cgroup_path`` on its hierarchy."""
        parts = [p for p in cgroup_path.split("/") if p]
        if not parts or any(p in (".", "..") for p in parts):
            raise invalid(f"bad cgroup path {cgroup_path!r}")
        path = "/" + "/".join(parts)
        out: dict[str, str] = {}
        for controller, mount in self.layout.mounts.items():
            root = self.layout.roots.get(controller, "/")
            rel = os.path.relpath(path, root if root.startswith("/") else "/")
            if rel == ".." or rel.startswith("../"):
                continue  # outside what this mount shows (a cgroup namespace)
            out[controller] = os.path.normpath(os.path.join(mount, rel))
        return out

    def create(self, cgroup_path: str, res: pb.LinuxContainerResources,
               account: bool = False) -> dict[str, str]:
        """Make the container's cgroup and write ``res``; {} when ``res`` asks for nothing
        (with ``account``: the accounting folders even then, see ``_account``). Raises
        ``Fault`` (nothing left behind) when the host cannot honour it."""
        lay = self.layout
        if lay.version == 0:
            writes = plan(res, 2)  # refuse what is refused anywhere first
            if not writes:
                return {}
            raise precondition(f"cannot enforce the container's resources: {lay.why}")
        writes = plan(res, lay.version)
        if not writes:
            return self._account(cgroup_path) if account else {}
        dirs = self.dirs_for(cgroup_path)
        needed = {w.controller for w in writes}
        missing = sorted(needed - set(dirs))
        if missing:
            raise precondition(f"cannot enforce the container's resources: the "
                               f"{', '.join(missing)} cgroup controller(s) are not mounted "
                               "on this host (cgroup v1)")
        if lay.version == 2:
            want = {_v2_controller(w.file) for w in writes}
            lacking = sorted(want - lay.v2_controllers)
            if lacking:
                raise precondition(
                    f"cannot enforce the container's resources: cgroup v2 at "
                    f"{lay.mounts[UNIFIED]} does not offer the {', '.join(lacking)} "
                    f"controller(s) (available: {sorted(lay.v2_controllers) or 'none'})")
        # v1: only the hierarchies it needs, plus memory and cpuacct (OOM kills and stats):
        # every folder costs a mkdir at create and a join at start
        dirs = {k: v for k, v in dirs.items()
                if k in needed or k in ("memory", "cpuacct", UNIFIED)}
        made: list[str] = []
        try:
            for controller in sorted(dirs):
                made.extend(_mkdirs(dirs[controller]))
            if lay.version == 2:
                self._enable(dirs[UNIFIED], {_v2_controller(w.file) for w in writes})
            self._write(dirs, writes, fresh=True)
        except BaseException as exc:
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    os.rmdir(d)
            if isinstance(exc, OSError):
                raise _refusal(exc) from None
            raise
        return dirs

    def _account(self, cgroup_path: str) -> dict[str, str]:
        """A container that limits nothing, in a pod cgroup: folders for accounting only
        (memory and cpuacct on v1, the unified one on v2), so the pod's usage shows in its
        cgroup as every container's does under the kubelet (the eviction manager reads it).
        Best effort: a folder that cannot be made (not root) leaves the container without
        one ({}), as before."""
        dirs = {k: v for k, v in self.dirs_for(cgroup_path).items()
                if k in ("memory", "cpuacct", UNIFIED)}
        made: list[str] = []
        try:
            for controller in sorted(dirs):
                made.extend(_mkdirs(dirs[controller]))
        except OSError:
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    os.rmdir(d)
            return {}
        return dirs

    def update(self, dirs: Mapping[str, str], res: pb.LinuxContainerResources) -> None:
        """Write ``res`` into an existing container cgroup (UpdateContainerResources)."""
        writes = plan(res, self.layout.version)
        missing = sorted({w.controller for w in writes} - set(dirs))
        if missing:
            raise precondition(f"cannot update the container's resources: its cgroup has no "
                               f"{', '.join(missing)} folder")
        try:
            self._write(dirs, writes)
        except OSError as err:
            raise _refusal(err) from None

    def _write(self, dirs: Mapping[str, str], writes: list[Write], fresh: bool = False) -> None:
        """``fresh``: a folder just made, whose limits are all unlimited, so the v1 memsw
        ordering (``_ordered``, a read of the current limit) is provably not needed."""
        for w in writes if fresh else _ordered(dirs, writes):
            path = os.path.join(dirs[w.controller], w.file)
            if w.optional and not os.path.exists(path):
                continue
            _write_file(path, w.value)

    def _enable(self, leaf: str, controllers: set[str]) -> None:
        """v2: enable ``controllers`` in cgroup.subtree_control from the mount down to the
        leaf's parent (what runc does)."""
        mount = self.layout.mounts[UNIFIED]
        chain = []
        d = os.path.dirname(leaf)
        while len(d) >= len(mount):
            chain.append(d)
            if d == mount:
                break
            d = os.path.dirname(d)
        for folder in reversed(chain):
            path = os.path.join(folder, "cgroup.subtree_control")
            try:
                with open(path) as f:
                    enabled = set(f.read().split())
            except FileNotFoundError:
                enabled = set()
            for name in sorted(controllers - enabled):
                _write_file(path, f"+{name}")

    @staticmethod
    def join_files(dirs: Mapping[str, str]) -> list[str]:
        """The files the container's process writes "0" (itself) into before its exec: on v1
        each hierarchy's ``tasks`` (moving one thread, the whole of a just-forked
        single-threaded process, skips the kernel's cgroup_threadgroup_rwsem, whose write side
        waits for an RCU grace period: ~0.2 ms instead of ~7-14 ms measured here through
        ``cgroup.procs``), on v2 ``cgroup.procs`` (v2's ``cgroup.threads`` needs threaded
        cgroups)."""
        return [os.path.join(d, "cgroup.procs" if dirs.get(UNIFIED) == d else "tasks")
                for d in sorted(set(dirs.values()))]

    def join(self, dirs: Mapping[str, str], pid: int) -> None:
        """Move ``pid`` into the container's cgroup (UpdateContainerResources on a container
        created without one; a new container joins in its monitor's child instead)."""
        for d in sorted(set(dirs.values())):
            _write_file(os.path.join(d, "cgroup.procs"), str(pid))

    def oom_killed(self, dirs: Mapping[str, str]) -> bool:
        """Did the kernel's OOM killer kill a process of this cgroup (v1 memory.oom_control
        ``oom_kill``, v2 memory.events ``oom_kill``)?"""
        if "memory" in dirs:
            stats = _keyed(os.path.join(dirs["memory"], "memory.oom_control"))
        elif UNIFIED in dirs:
            stats = _keyed(os.path.join(dirs[UNIFIED], "memory.events"))
        else:
            return False
        return stats.get("oom_kill", 0) > 0

    def usage(self, dirs: Mapping[str, str]) -> Usage | None:
        """CPU and memory as cAdvisor/the kubelet read them: working set = usage minus
        inactive file pages. None when the cgroup cannot be read."""
        try:
            if UNIFIED in dirs:
                d = dirs[UNIFIED]
                cpu = _keyed(os.path.join(d, "cpu.stat")).get("usage_usec", 0) * 1000
                mem = _int_file(os.path.join(d, "memory.current"))
                stat = _keyed(os.path.join(d, "memory.stat"))
                inactive, rss = stat.get("inactive_file", 0), stat.get("anon", 0)
            else:
                cpu = _int_file(os.path.join(dirs["cpuacct"], "cpuacct.usage")) \
                    if "cpuacct" in dirs else 0
                mem = _int_file(os.path.join(dirs["memory"], "memory.usage_in_bytes")) \
                    if "memory" in dirs else 0
                stat = _keyed(os.path.join(dirs["memory"], "memory.stat")) \
                    if "memory" in dirs else {}
                inactive, rss = stat.get("total_inactive_file", 0), stat.get("total_rss", 0)
        except (OSError, ValueError):
            return None
        return Usage(cpu, mem, max(0, mem - inactive), rss)

    def remove(self, dirs: Mapping[str, str]) -> list[str]:
        """SIGKILL what is left in the container's cgroup (as runc does on delete), then rmdir
        its folders; returns "folder: reason" for those that could not go."""
        failed = []
        for d in sorted(set(dirs.values())):
            deadline = self._monotonic() + REMOVE_WAIT
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as err:
                    if err.errno != errno.EBUSY or self._monotonic() > deadline:
                        failed.append(f"{d}: {err.strerror}")
                        break
                    _kill_members(d)
                    self._sleep(0.005)
        return failed


def _ordered(dirs: Mapping[str, str], writes: list[Write]) -> list[Write]:
    """v1 memory: memory.limit_in_bytes may never exceed memsw, so when the limit grows,
    memsw goes first (runc's order)."""
    if "memory" not in dirs:
        return writes
    try:
        current = _int_file(os.path.join(dirs["memory"], "memory.limit_in_bytes"))
    except (OSError, ValueError):
        return writes
    new = next((int(w.value) for w in writes if w.file == "memory.limit_in_bytes"), None)
    if new is None or new <= current:
        return writes
    memsw = [w for w in writes if w.file == "memory.memsw.limit_in_bytes"]
    return memsw + [w for w in writes if w.file != "memory.memsw.limit_in_bytes"]


def _mkdirs(path: str) -> list[str]:
    """mkdir -p; returns the folders it created, parents first."""
    made: list[str] = []
    try:  # the usual case, the parent (the pod's folder) exists: one mkdir, no stat
        os.mkdir(path, 0o755)
        return [path]
    except FileExistsError:
        return []
    except FileNotFoundError:
        pass
    todo = []
    d = path
    while not os.path.isdir(d):
        todo.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    for folder in reversed(todo):
        try:
            os.mkdir(folder, 0o755)
            made.append(folder)
        except FileExistsError:
            continue
    return made


def _write_file(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, value.encode())
    except OSError as err:
        raise OSError(err.errno, f"{err.strerror} (writing {value!r})", path) from None
    finally:
        os.close(fd)


def _int_file(path: str) -> int:
    with open(path) as f:
        return int(f.read().split()[0])


def _keyed(path: str) -> dict[str, int]:
    """A flat-keyed cgroup file ("key value" lines); {} when it cannot be read."""
    out: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[1].lstrip("-").isdigit():
                    out[parts[0]] = int(parts[1])
    except OSError:
        pass
    return out


def _kill_members(folder: str) -> None:
    try:
        with open(os.path.join(folder, "cgroup.procs")) as f:
            pids = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _refusal(err: OSError) -> Fault:
    hint = ""
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = (" (the embedded runtime must run as root, or own the cgroup hierarchy, to "
                "enforce resources; run podvisor as root or remove the pod's resources)")
    return precondition(f"cannot enforce the container's resources: {err.filename}: "
                        f"{err.strerror}{hint}")
