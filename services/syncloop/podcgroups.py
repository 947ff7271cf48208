"""Pod cgroups under ``cgroupRoot``, as the kubelet's pod container manager names them.

Every sandbox gets ``linux.cgroup_parent`` = the pod's folder by its QoS class (``parent``):
``<cgroupRoot>/pod<uid>`` for Guaranteed, ``<cgroupRoot>/burstable/pod<uid>`` and
``<cgroupRoot>/besteffort/pod<uid>`` for the others (the QoS folders are made by the runtime
as parents and kept, as the kubelet keeps its QoS cgroups). Removal and the leftover scan look
at all three places (a pod's class is not known once it is gone). The runtime
(containerd with the cgroupfs driver) creates ``<parent>/<container id>`` in every hierarchy and
removes the leaves, but containerd 1.6 leaves the pod folder behind. So after a pod's sandboxes
are removed the sync loop removes the pod's folders on every mounted cgroup hierarchy (v1
controllers and v2 unified, found in /proc/self/mountinfo), deepest first, with rmdir only: a
folder still in use (EBUSY, ENOTEMPTY) is logged and the pod is retried at the next
housekeeping. Housekeeping also removes ``pod<uid>`` folders under the root whose UID no pod
has (a crash between teardown and cleanup). A pod this agent terminated (``remove(uid,
kill_left=True)``: its termination read it back empty from the runtime) may still have a process
in one of its folders, which belongs to no container the runtime knows: it is killed (SIGKILL,
logged ``syncloop.pod.cgroup.killed``, also at the retries) and the folder goes at the next
attempt, as the kubelet's pod container manager kills what is left in a pod cgroup it destroys.
(containerd 1.6 killed mid-burst leaves such processes: the `runc init` of a task made for a
start its crash cut off, which the restarted containerd lists nowhere.) Folders of pods this
agent does not know (the leftover scan) are never killed in: another agent on the same
``cgroupRoot`` may run them.

Pod-level limits (``pod_limits``, the kubelet's ``ResourceConfigForPod``): for Guaranteed and
Burstable pods the sync loop makes the pod's folder itself before RunPodSandbox (``ensure``) and
writes CPU shares = the sum of the CPU requests, CPU quota = the sum of the CPU limits when
every container has one, memory limit = the sum of the memory limits when every container has
one (init containers count as the kubelet's ``PodRequests``/``PodLimits`` do: the larger of the
regular containers' sum and any one init container), and ``pids.max`` = ``podPidsLimit`` when
it is positive (-1, the default, as the kubelet: unlimited). v1: in the memory/cpu/pids
hierarchies; v2: memory.max, cpu.weight, cpu.max, pids.max, with the controllers enabled in
``cgroup.subtree_control`` from the mount down to the pod's parent. BestEffort pods get no
folder from podvisor (the runtime makes it when a container needs one). A write that fails
refuses the pod's sandbox with the reason (``PodCgroupError``).

Path logic is pure functions (``parse_mountinfo``, ``hierarchy_dirs``, ...); the filesystem is
a ``CgroupFS``. ``PodCgroups`` is thread-safe (terminations run on pool threads).
"""

from __future__ import annotations

import errno
import os
import re
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from podvisor.common.logs import Log
from podvisor.services.pod import Container, Pod
from podvisor.services.syncloop.cgroupfs import CgroupFS
from podvisor.services.syncloop.cri_config import (
    CPU_PERIOD_US,
    milli_cpu_to_quota,
    milli_cpu_to_shares,
)

POD_PREFIX = "pod"
MAX_DEPTH = 32  # nested cgroups a container may have made under its own
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class CgroupMount:
    mount_point: str  # where the hierarchy is mounted, e.g. /sys/fs/cgroup/memory
    root: str         # the hierarchy's folder mounted there ("/" unless in a cgroup namespace)
    fstype: str       # "cgroup" (v1) or "cgroup2"
    options: str      # super options: the v1 controllers ("rw,memory") or "rw"


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """The cgroup (v1) and cgroup2 mounts in a /proc/<pid>/mountinfo text, in order."""
    out: list[CgroupMount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        out.append(CgroupMount(mount_point=_unescape(fields[4]), root=_unescape(fields[3]),
                               fstype=tail[0], options=tail[2] if len(tail) > 2 else ""))
    return out


# The kubelet's QoS cgroups under the node's root (pkg/kubelet/cm/qos_container_manager):
# Guaranteed pods sit right under it, the others in one folder per class.
QOS_FOLDERS = {"Guaranteed": "", "Burstable": "burstable", "BestEffort": "besteffort"}


def pod_cgroup_parent(cgroup_root: str, uid: str, qos: str = "Guaranteed") -> str:
    """``<cgroupRoot>/pod<uid>`` (Guaranteed), ``<cgroupRoot>/burstable/pod<uid>``,
    ``<cgroupRoot>/besteffort/pod<uid>``; "" when pod cgroups are disabled
    (``cgroupRoot: ""``)."""
    if not cgroup_root:
        return ""
    folder = QOS_FOLDERS.get(qos, "")
    base = cgroup_root.rstrip("/") + (f"/{folder}" if folder else "")
    return f"{base}/{POD_PREFIX}{uid}"


def pod_uid(folder_name: str) -> str | None:
    """The UID in a ``pod<uid>`` folder name, else None."""
    if not folder_name.startswith(POD_PREFIX):
        return None
    uid = folder_name[len(POD_PREFIX):]
    return uid if _UID.fullmatch(uid) else None


def hierarchy_dirs(mounts: Sequence[CgroupMount], cgroup_path: str) -> list[str]:
    """The folder of ``cgroup_path`` in every mounted hierarchy where it is visible (as runc
    maps it: the mount point joined with the path relative to the mount's root), no duplicates."""
    out: list[str] = []
    path = os.path.normpath("/" + cgroup_path.strip("/"))
    for m in mounts:
        rel = os.path.relpath(path, m.root if m.root.startswith("/") else "/")
        if rel == ".." or rel.startswith("../"):
            continue  # outside what this mount shows
        folder = os.path.normpath(os.path.join(m.mount_point, rel))
        if folder not in out:
            out.append(folder)
    return out


def removal_order(dirs: Iterable[str]) -> list[str]:
    """Deepest first (children before parents), stable by path otherwise."""
    return sorted(set(dirs), key=lambda d: (-d.rstrip("/").count("/"), d))


@dataclass(frozen=True)
class PodLimits:
    """What the pod's own cgroup enforces (None: unlimited / not written)."""
    cpu_shares: int
    cpu_quota: int | None = None  # microseconds per ``cpu_period``
    cpu_period: int = CPU_PERIOD_US
    memory_bytes: int | None = None
    pids: int | None = None


def _pod_amount(pod: Pod, amount: Callable[[Container], int | None]) -> tuple[int, bool]:
    """(the pod's amount, whether every container declares one): the larger of the regular
    containers' sum and each init container's (init containers run one at a time)."""
    regular = [amount(c) for c in pod.spec.containers]
    init = [amount(c) for c in pod.spec.init_containers]
    total = max([sum(a or 0 for a in regular)] + [a or 0 for a in init])
    return total, all(a for a in regular + init)


def pod_limits(pod: Pod, qos: str, pids_limit: int = -1) -> PodLimits | None:
    """The kubelet's ``ResourceConfigForPod`` for a Guaranteed or Burstable pod; None for
    BestEffort (no folder of podvisor's own)."""
    if qos not in ("Guaranteed", "Burstable"):
        return None
    cpu_request, _ = _pod_amount(pod, lambda c: c.resources.requests.cpu_millis)
    cpu_limit, cpu_all = _pod_amount(pod, lambda c: c.resources.limits.cpu_millis)
    memory, memory_all = _pod_amount(pod, lambda c: c.resources.limits.memory_bytes)
    return PodLimits(
        cpu_shares=milli_cpu_to_shares(cpu_request),
        cpu_quota=milli_cpu_to_quota(cpu_limit) if cpu_all and cpu_limit else None,
        memory_bytes=memory if memory_all and memory else None,
        pids=pids_limit if pids_limit > 0 else None)


def _shares_to_weight(shares: int) -> int:
    """runc's cpu.shares -> cpu.weight ([2, 262144] -> [1, 10000])."""
    return max(1, min(10_000, 1 + ((shares - 2) * 9999) // 262_142))


def limit_writes(limits: PodLimits, v2: bool) -> list[tuple[str, str, str]]:
    """(controller, file, value) in order, for cgroup v1 or v2."""
    out: list[tuple[str, str, str]] = []
    if v2:
        out.append(("cpu", "cpu.weight", str(_shares_to_weight(limits.cpu_shares))))
        if limits.cpu_quota is not None:
            out.append(("cpu", "cpu.max", f"{limits.cpu_quota} {limits.cpu_period}"))
        if limits.memory_bytes is not None:
            out.append(("memory", "memory.max", str(limits.memory_bytes)))
        if limits.pids is not None:
            out.append(("pids", "pids.max", str(limits.pids)))
        return out
    out.append(("cpu", "cpu.shares", str(limits.cpu_shares)))
    if limits.cpu_quota is not None:
        out.append(("cpu", "cpu.cfs_period_us", str(limits.cpu_period)))
        out.append(("cpu", "cpu.cfs_quota_us", str(limits.cpu_quota)))
    if limits.memory_bytes is not None:
        out.append(("memory", "memory.limit_in_bytes", str(limits.memory_bytes)))
    if limits.pids is not None:
        out.append(("pids", "pids.max", str(limits.pids)))
    return out


class PodCgroupError(Exception):
    """The pod's cgroup cannot be made or limited: the reason, for the pod's status."""


@dataclass(frozen=True)
class Removal:
    removed: int                 # folders removed
    failed: tuple[str, ...]      # "path: reason" of folders that could not go
    killed: tuple[int, ...] = ()  # PIDs found in a busy folder and killed


class PodCgroups:
    def __init__(self, cgroup_root: str, fs: CgroupFS, log: Log, pids_limit: int = -1) -> None:
        self.root = cgroup_root
        self.fs = fs
        self.log = log
        self.pids_limit = pids_limit  # podPidsLimit (-1: unlimited)
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}  # uid -> failed attempts
        self._terminated: set[str] = set()  # pending pods this agent terminated (kill_left)
        self._mountinfo: tuple[str, tuple[CgroupMount, ...]] | None = None  # text, parsed

    @property
    def enabled(self) -> bool:
        return bool(self.root)

    def parent(self, uid: str, qos: str = "Guaranteed") -> str:
        return pod_cgroup_parent(self.root, uid, qos)

    def ensure(self, pod: Pod, qos: str) -> PodLimits | None:
        """Make the pod's folder and write its limits (``pod_limits``) before its sandbox;
        None (nothing made) for a BestEffort pod. Raises ``PodCgroupError`` with the reason."""
        limits = pod_limits(pod, qos, self.pids_limit)
        if limits is None or not self.enabled:
            return limits
        path = self.parent(pod.uid, qos)
        mounts = self._mounts()
        v1 = {ctl: m for m in mounts if m.fstype == "cgroup"
              for ctl in m.options.split(",")}
        unified = next((m for m in mounts if m.fstype == "cgroup2"), None)
        writes = limit_writes(limits, v2=not v1 and unified is not None)
        try:
            for controller, file, value in writes:
                mount = v1.get(controller) if v1 else unified
                if mount is None:
                    raise PodCgroupError(f"the {controller} cgroup controller is not mounted "
                                         "on this host")
                folder = hierarchy_dirs([mount], path)
                if not folder:
                    raise PodCgroupError(f"{path} is outside the {controller} hierarchy "
                                         f"mounted at {mount.mount_point}")
                if mount.fstype == "cgroup2":
                    self._enable(mount, folder[0], controller)
                self.fs.mkdir(folder[0])
                self.fs.write(os.path.join(folder[0], file), value)
        except OSError as err:
            where = err.filename or path
            raise PodCgroupError(f"{where}: {err.strerror or err}") from None
        self.log.info("syncloop.pod.cgroup.limits", pod=pod.full_name, pod_uid=pod.uid,
                      cgroup=path, limits={f: v for _c, f, v in writes})
        return limits

    def _enable(self, mount: CgroupMount, folder: str, controller: str) -> None:
        """v2: ``+controller`` in cgroup.subtree_control from the mount down to the pod
        folder's parent (where it is not yet), as runc does for a container."""
        chain, d = [], os.path.dirname(folder)
        while len(d) >= len(mount.mount_point):
            chain.append(d)
            if d == mount.mount_point:
                break
            d = os.path.dirname(d)
        for d in reversed(chain):
            self.fs.mkdir(d)
            control = os.path.join(d, "cgroup.subtree_control")
            try:
                enabled = self.fs.read(control).split()
            except FileNotFoundError:
                enabled = []
            if controller not in enabled:
                self.fs.write(control, f"+{controller}")

    def pending(self) -> set[str]:
        """UIDs whose folders could not all be removed yet (retried at housekeeping)."""
        with self._lock:
            return set(self._pending)

    def remove(self, uid: str, kill_left: bool = False) -> bool:
        """Remove the pod's empty folders on every hierarchy; False (remembered in ``pending``,
        logged) when one is still in use. ``kill_left``: the runtime shows nothing of the pod
        (this agent terminated it): kill the processes in a folder in use, now and at the
        retries."""
        if not self.enabled:
            return True
        with self._lock:
            if kill_left:
                self._terminated.add(uid)
            kill = uid in self._terminated
        results = [self._remove_path(self.parent(uid, qos), kill) for qos in QOS_FOLDERS]
        result = Removal(sum(r.removed for r in results),
                         tuple(f for r in results for f in r.failed),
                         tuple(p for r in results for p in r.killed))
        if result.killed:
            self.log.warning("syncloop.pod.cgroup.killed", pod_uid=uid, pids=list(result.killed),
                             reason="left in the cgroup of a pod the runtime shows nothing of")
        with self._lock:
            attempts = self._pending.pop(uid, 0)
            if result.failed:
                self._pending[uid] = attempts + 1
            else:
                self._terminated.discard(uid)
        if result.failed:
            log = self.log.warning if attempts == 0 else self.log.debug
            log("syncloop.pod.cgroup.busy", pod_uid=uid, attempt=attempts + 1,
                folders=list(result.failed))
        elif result.removed:
            self.log.info("syncloop.pod.cgroup.removed", pod_uid=uid, folders=result.removed,
                          retries=attempts)
        return not result.failed

    def leftovers(self, known: Collection[str]) -> set[str]:
        """UIDs of ``pod<uid>`` folders under the root, on any hierarchy, not in ``known``."""
        if not self.enabled:
            return set()
        found: set[str] = set()
        mounts = self._mounts()
        bases = [self.root.rstrip("/") + (f"/{q}" if q else "") for q in QOS_FOLDERS.values()]
        for folder in (d for base in bases for d in hierarchy_dirs(mounts, base)):
            for name in self.fs.child_dirs(folder):
                uid = pod_uid(name)
                if uid is not None and uid not in known:
                    found.add(uid)
        return found

    def _mounts(self) -> list[CgroupMount]:
        """The cgroup mounts, parsed again only when mountinfo's text changed."""
        try:
            text = self.fs.mountinfo()
        except OSError as err:
            self.log.warning("syncloop.cgroup.mountinfo_failed", error=str(err))
            return []
        with self._lock:
            if self._mountinfo is not None and self._mountinfo[0] == text:
                return list(self._mountinfo[1])
        mounts = parse_mountinfo(text)
        with self._lock:
            self._mountinfo = (text, tuple(mounts))
        return mounts

    def _subtree(self, folder: str) -> list[str]:
        out, frontier = [folder], [folder]
        for _ in range(MAX_DEPTH):
            frontier = [os.path.join(d, n) for d in frontier for n in self.fs.child_dirs(d)]
            if not frontier:
                break
            out.extend(frontier)
        return out

    def _remove_path(self, cgroup_path: str, kill: bool) -> Removal:
        removed, failed, killed = 0, [], []
        for folder in hierarchy_dirs(self._mounts(), cgroup_path):
            for d in removal_order(self._subtree(folder)):
                try:
                    self.fs.rmdir(d)
                    removed += 1
                except FileNotFoundError:
                    continue
                except OSError as err:
                    name = errno.errorcode.get(err.errno or 0, str(err.errno))
                    failed.append(f"{d}: {name} {err.strerror}")
                    if kill and err.errno == errno.EBUSY:  # processes in it: nobody's
                        for pid in self.fs.procs(d):
                            if pid not in killed:
                                self.fs.kill(pid)
                                killed.append(pid)
                    break  # its parents cannot go either
        return Removal(removed, tuple(failed), tuple(killed))


def new_pod_cgroups(cgroup_root: str, fs: CgroupFS, log: Log,
                    pids_limit: int = -1) -> PodCgroups:
    return PodCgroups(cgroup_root, fs, log, pids_limit)
