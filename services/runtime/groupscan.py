"""CPU and memory of process groups from /proc: what a container without a cgroup uses.

``GroupScanner.usage`` sums, over the live members of each wanted process group, user + system
time (``/proc/<pid>/stat`` fields 14 and 15, as psutil's ``cpu_times``: whole clock ticks, so
a fresh process that has used less than a tick counts 0) and resident pages (field 24), without
a psutil ``Process`` and its extra reads per member. Since Linux 6.2 ``stat``'s rss is the
per-CPU counters' approximate value, without their pending deltas: it may be off from the exact
figure by up to 3 x CPUs x max(32, 2 x CPUs) pages per process (768 KiB on 2 CPUs), and a
process that has just exec'd, all of whose pages are still per-CPU deltas, reads 0 there. So a
member whose ``stat`` rss is under that bound is read again from ``statm`` (its second field:
the exact sum since Linux 6.16, as in ``status``' VmRSS, which psutil reads): small processes
are exact, larger ones cost one read and are within the bound. (``statm`` is opened for that
read, not kept: few members are that small for long.)

Finding the members. A full pass lists /proc and reads every process's ``stat``: its cost
grows with every process on the machine, not with the containers (listing /proc alone took
0.7 ms with 1,600 processes on the 2-core test VM, more than reading 110 members). So between
full passes (every ``full_every`` seconds of ``now``, any clock; a step back also makes one)
a pass reads only the previous pass's members, every wanted group's leader (a new
container's process) and, recursively, the children the kernel lists for each member
(``/proc/<pid>/task/<tid>/children``, every thread's; CONFIG_PROC_CHILDREN, checked once:
without it a pass lists /proc and reads, besides those, the pids new since its previous
listing). Blind spots until the next full pass: a process that joins a wanted group by
``setpgid`` or a reused pid (from outside the members' tree), and, with children lists, an
orphan whose parent left before a pass saw it (a daemon's double fork: it is re-parented to
a subreaper or init, no member lists it); once seen, a process is read at every pass until
it leaves.

Each member's ``stat`` (and its main thread's ``children``) stays open between passes, up to
``max_open`` members (the rest are opened and closed per read), and is read again with
``pread``: one syscall instead of three. The descriptor names the process, not the pid: once
that process is gone its reads fail (ESRCH) and the pid, if listed again, is opened afresh.
Descriptors of processes no longer members are closed at the end of a pass, the rest by
``close()``. Not thread-safe.
"""

from __future__ import annotations

import os
import resource

from podvisor.services.runtime.procfs import CLOCK_TICKS

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_NS_PER_TICK = 1_000_000_000 // CLOCK_TICKS
_CPUS = os.cpu_count() or 1
# stat's rss may miss up to this many pages (3 counters' per-CPU deltas, each under the batch
# max(32, 2 x CPUs) on every CPU): below it, statm's exact figure is read instead
APPROX_PAGES = 3 * _CPUS * max(32, 2 * _CPUS)


def children_files() -> bool:
    """Whether this kernel lists a task's children (``/proc/<pid>/task/<tid>/children``)."""
    pid = os.getpid()
    return os.path.exists(f"/proc/{pid}/task/{pid}/children")


def default_max_open() -> int:
    """Members whose descriptors (two each) are kept: at most 1/8 of the soft descriptor
    limit for all of them, and no more than 1,024 members."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(0, min(1024, soft // 16))


class _Open:
    """A member's kept descriptors: its ``stat`` and its main thread's ``children`` (-1:
    not open)."""

    __slots__ = ("children", "stat")

    def __init__(self, stat: int) -> None:
        self.stat = stat
        self.children = -1

    def close(self) -> None:
        for fd in (self.stat, self.children):
            if fd >= 0:
                os.close(fd)
        self.stat = self.children = -1


class GroupScanner:
    """CPU (ns) and resident bytes per wanted process group; see the module's docstring."""

    def __init__(self, full_every: float = 30.0, max_open: int | None = None,
                 follow_children: bool | None = None) -> None:
        """``max_open``: members whose descriptors are kept (default ``default_max_open()``);
        ``follow_children``: find members through the kernel's children lists between full
        passes (default: when the kernel has them; False: list /proc at every pass and read
        the pids not listed at the previous one)."""
        self._full_every = full_every
        self._max_open = default_max_open() if max_open is None else max_open
        self._follow = children_files() if follow_children is None else follow_children
        # pid (its /proc name) -> its kept descriptors, None past ``max_open`` (still a member:
        # read at every pass, through descriptors opened for that read)
        self._members: dict[str, _Open | None] = {}
        self._listed: set[str] = set()  # without children lists: /proc's last listing
        self._last_full: float | None = None

    def usage(self, pgids: set[int], now: float) -> dict[int, tuple[int, int]]:
        full = self._last_full is None or not 0 <= now - self._last_full < self._full_every
        if full:
            self._last_full = now
            queue = [n for n in os.listdir("/proc") if n.isdigit()]
            if not self._follow:
                self._listed = set(queue)
        else:  # last pass's members and every group's leader, then their children
            queue = [*self._members, *(str(p) for p in pgids)]
            if not self._follow:  # no children lists: the pids new since the last listing
                listed = set(os.listdir("/proc"))
                queue += [n for n in listed - self._listed if n.isdigit()]
                self._listed = listed
        old, kept = self._members, dict[str, _Open | None]()
        open_count = 0
        out: dict[int, tuple[int, int]] = {}
        visited: set[str] = set()
        try:
            for name in queue:  # (grows while it is walked: members' children join it)
                if name in visited:
                    continue
                visited.add(name)
                fds, fields = self._read_stat(name, old.pop(name, None))
                if fields is None or len(fields) < 22:
                    fds.close()
                    continue
                pgid = int(fields[2])
                if pgid not in pgids or fields[0] in (b"Z", b"X"):
                    fds.close()
                    continue
                pages = int(fields[21])
                if pages < APPROX_PAGES:  # maybe all per-CPU deltas: the exact figure
                    pages = _exact_pages(name, pages)
                cpu, rss = out.get(pgid, (0, 0))
                out[pgid] = (cpu + (int(fields[11]) + int(fields[12])) * _NS_PER_TICK,
                             rss + pages * PAGE_SIZE)
                if not full and self._follow:
                    queue.extend(_children(name, fds, int(fields[17])))
                if open_count < self._max_open:
                    kept[name] = fds
                    open_count += 1
                else:
                    fds.close()
                    kept[name] = None
        finally:
            for gone in old.values():  # gone, or no longer a member
                if gone is not None:
                    gone.close()
            self._members = kept
        return out

    @staticmethod
    def _read_stat(name: str, fds: _Open | None) -> tuple[_Open, list[bytes] | None]:
        """The process's ``stat`` fields after comm (through the kept descriptor, else a new
        one); None, its descriptors closed, when it is gone."""
        if fds is not None:
            raw = _pread(fds.stat)
            if raw:
                return fds, _after_comm(raw)
            fds.close()  # that process is gone (the pid may name a new one)
        fds = _Open(_open(f"/proc/{name}/stat"))
        raw = _pread(fds.stat) if fds.stat >= 0 else b""
        if not raw:
            fds.close()
            return fds, None
        return fds, _after_comm(raw)

    def open_count(self) -> int:
        """Members whose descriptors are kept open."""
        return sum(1 for fds in self._members.values() if fds is not None)

    def close(self) -> None:
        """Close the kept descriptors (the scanner still works: it opens them again; the
        members stay known)."""
        for name, fds in self._members.items():
            if fds is not None:
                fds.close()
                self._members[name] = None


def _children(name: str, fds: _Open, threads: int) -> list[str]:
    """The pids the kernel lists as children of the process's threads (the main thread's
    list through its kept descriptor)."""
    if fds.children < 0:
        fds.children = _open(f"/proc/{name}/task/{name}/children")
    raw = _pread(fds.children) if fds.children >= 0 else b""
    if threads > 1:  # a thread's children are its own: read every other thread's too
        try:
            tids = os.listdir(f"/proc/{name}/task")
        except OSError:
            tids = []
        for tid in tids:
            if tid != name:
                fd = _open(f"/proc/{name}/task/{tid}/children")
                if fd >= 0:
                    raw += b" " + _pread(fd)
                    os.close(fd)
    return raw.decode().split()


def _exact_pages(name: str, approx: int) -> int:
    """The process's resident pages from ``statm`` (exact on Linux 6.16 and later), or
    ``approx`` (``stat``'s) when it is gone."""
    fd = _open(f"/proc/{name}/statm")
    if fd < 0:
        return approx
    try:
        fields = _pread(fd).split()
    finally:
        os.close(fd)
    return int(fields[1]) if len(fields) > 1 else approx


def _after_comm(raw: bytes) -> list[bytes]:
    """``stat``'s fields from the state on (comm, field 2, may hold spaces and parentheses:
    split after the last ')')."""
    return raw[raw.rfind(b")") + 2:].split()


def _open(path: str) -> int:
    """A read-only descriptor of ``path``, or -1 when its process is gone."""
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:
        return -1


def _pread(fd: int) -> bytes:
    """A small /proc file's bytes from its start (b"" when its process is gone)."""
    try:
        return os.pread(fd, 4096, 0)
    except OSError:
        return b""
