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
has (a crash between teardown and cleanup).

Path logic is pure functions (``parse_mountinfo``, ``hierarchy_dirs``, ...); the filesystem is
a ``CgroupFS``. ``PodCgroups`` is thread-safe (terminations run on pool threads).
"""

from __future__ import annotations

import errno
import os
import re
import threading
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from podvisor.common.logs import Log
from podvisor.services.syncloop.cgroupfs import CgroupFS

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
class Removal:
    removed: int                 # folders removed
    failed: tuple[str, ...]      # "path: reason" of folders that could not go


class PodCgroups:
    def __init__(self, cgroup_root: str, fs: CgroupFS, log: Log) -> None:
        self.root = cgroup_root
        self.fs = fs
        self.log = log
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}  # uid -> failed attempts
        self._mountinfo: tuple[str, tuple[CgroupMount, ...]] | None = None  # text, parsed

    @property
    def enabled(self) -> bool:
        return bool(self.root)

    def parent(self, uid: str, qos: str = "Guaranteed") -> str:
        return pod_cgroup_parent(self.root, uid, qos)

    def pending(self) -> set[str]:
        """UIDs whose folders could not all be removed yet (retried at housekeeping)."""
        with self._lock:
            return set(self._pending)

    def remove(self, uid: str) -> bool:
        """Remove the pod's empty folders on every hierarchy; False (remembered in ``pending``,
        logged) when one is still in use."""
        if not self.enabled:
            return True
        results = [self._remove_path(self.parent(uid, qos)) for qos in QOS_FOLDERS]
        result = Removal(sum(r.removed for r in results),
                         tuple(f for r in results for f in r.failed))
        with self._lock:
            attempts = self._pending.pop(uid, 0)
            if result.failed:
                self._pending[uid] = attempts + 1
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

    def _remove_path(self, cgroup_path: str) -> Removal:
        removed, failed = 0, []
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
                    break  # its parents cannot go either
        return Removal(removed, tuple(failed))


def new_pod_cgroups(cgroup_root: str, fs: CgroupFS, log: Log) -> PodCgroups:
    return PodCgroups(cgroup_root, fs, log)
