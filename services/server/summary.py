"""``/stats/summary`` of the main port, in the kubelet's shape (``stats/v1alpha1`` Summary).

Pods and containers come from the runtime's CRI ``ListContainerStats`` (running containers
only, as the kubelet leaves terminated instances out; the
pod is named by the container's ``io.kubernetes.pod.*`` labels, the container by its metadata),
start times from the ``pleg`` replica's sandbox and container records; a pod's CPU and memory are
its containers' sums. The node's CPU and memory come from /proc (psutil): ``usageNanoCores`` is
the rate since the previous scrape (0 on the first), as the kubelet's; ``fs`` is the file
system of ``rootDir``. The runtime's own ``usageNanoCores`` is also a rate since its previous
sample. ``node.runtime.imageFs`` is CRI ImageFsInfo's first image file system (its used bytes and
inodes; capacity and available bytes from ``statvfs`` of its mount point when readable). Each
container's ``logs`` is the bytes and files of its log directory under ``rootDir/pod-logs``,
every restart's files and rotated ones (gzipped included) counted (``log_usage``).
"""

from __future__ import annotations

import datetime
import os
import threading
from collections.abc import Mapping
from typing import Any

import psutil
from cri_api.v1 import api_pb2 as pb

from podvisor.ipc.maps import PlegPod

__all__ = ["NodeSampler", "image_fs_stats", "log_usage", "rfc3339", "summary"]

POD_NAME, POD_NS, POD_UID = ("io.kubernetes.pod.name", "io.kubernetes.pod.namespace",
                             "io.kubernetes.pod.uid")


_STAMPS: dict[int, str] = {}  # whole second -> its RFC 3339 text (a scrape's stamps share few)


def rfc3339(epoch_ns: int) -> str:
    """To the second, as the kubelet's ``metav1.Time``; memoised per second (a scrape of 110
    pods formats some 600 stamps, nearly all of the same few seconds)."""
    sec = epoch_ns // 1_000_000_000
    text = _STAMPS.get(sec)
    if text is None:
        if len(_STAMPS) >= 4096:  # start times and sample times: bounded all the same
            _STAMPS.clear()
        when = datetime.datetime.fromtimestamp(sec, datetime.UTC)
        text = _STAMPS[sec] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    return text


class NodeSampler:
    """The node's CPU and memory; CPU rate from the previous sample (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prev: tuple[int, int] | None = None

    def sample(self, now_ns: int, root_dir: str) -> dict[str, Any]:
        times = psutil.cpu_times()
        busy_ns = int((sum(times) - times.idle - getattr(times, "iowait", 0.0)) * 1e9)
        with self._lock:
            prev, self._prev = self._prev, (now_ns, busy_ns)
        rate = 0
        if prev is not None and now_ns > prev[0]:
            rate = max(busy_ns - prev[1], 0) * 1_000_000_000 // (now_ns - prev[0])
        mem = psutil.virtual_memory()
        stamp = rfc3339(now_ns)
        node: dict[str, Any] = {
            "cpu": {"time": stamp, "usageNanoCores": rate, "usageCoreNanoSeconds": busy_ns},
            "memory": {"time": stamp, "availableBytes": mem.available,
                       "usageBytes": mem.total - mem.free,
                       "workingSetBytes": mem.total - mem.available,
                       "rssBytes": mem.total - mem.available - getattr(mem, "cached", 0)
                       if mem.total - mem.available > getattr(mem, "cached", 0) else 0},
        }
        try:
            disk = psutil.disk_usage(root_dir)
            st = os.statvfs(root_dir)
            node["fs"] = {"time": stamp, "availableBytes": disk.free,
                          "capacityBytes": disk.total, "usedBytes": disk.used,
                          "inodesFree": st.f_ffree, "inodes": st.f_files,
                          "inodesUsed": st.f_files - st.f_ffree}
        except OSError:
            pass
        return node


def _cpu(stats: pb.ContainerStats) -> dict[str, Any] | None:
    if not stats.HasField("cpu"):
        return None
    return {"time": rfc3339(stats.cpu.timestamp),
            "usageNanoCores": stats.cpu.usage_nano_cores.value,
            "usageCoreNanoSeconds": stats.cpu.usage_core_nano_seconds.value}


def _memory(stats: pb.ContainerStats) -> dict[str, Any] | None:
    if not stats.HasField("memory"):
        return None
    m = stats.memory
    return {"time": rfc3339(m.timestamp), "usageBytes": m.usage_bytes.value,
            "workingSetBytes": m.working_set_bytes.value, "rssBytes": m.rss_bytes.value}


def _sum(parts: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any] | None:
    if not parts:
        return None
    if len(parts) == 1:  # the common pod: one container
        return {"time": parts[0]["time"], **{key: int(parts[0].get(key, 0)) for key in keys}}
    out: dict[str, Any] = {"time": max(p["time"] for p in parts)}
    for key in keys:
        out[key] = sum(int(p.get(key, 0)) for p in parts)
    return out


class _LogDirs:
    """``log_usage``'s memory between scrapes (thread-safe): a pod folder's container folders
    while its mtime holds, and per container folder (while its mtime holds: no file was added,
    removed or renamed) the bytes of every file but the live one (``<restartCount>.log`` of the
    highest count: rotated files and earlier instances' logs no longer change). A scrape then
    costs three ``stat`` calls per container instead of two folder listings and a ``stat`` per
    file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, tuple[int, list[str]]] = {}
        # container folder -> (mtime ns, live file name or "", other files' bytes, files)
        self._containers: dict[str, tuple[int, str, int, int]] = {}

    def usage(self, pod_logs: str) -> dict[tuple[str, str], tuple[int, int]]:
        out: dict[tuple[str, str], tuple[int, int]] = {}
        try:
            pod_dirs = list(os.scandir(pod_logs))
        except OSError:
            return out
        with self._lock:
            pods, containers = dict(self._pods), dict(self._containers)
        seen_pods: dict[str, tuple[int, list[str]]] = {}
        seen: dict[str, tuple[int, str, int, int]] = {}
        for pod_dir in pod_dirs:
            parts = pod_dir.name.split("_", 2)
            if len(parts) != 3:
                continue
            try:
                if not pod_dir.is_dir():
                    continue
                mtime = pod_dir.stat().st_mtime_ns
                cached = pods.get(pod_dir.path)
                names = cached[1] if cached is not None and cached[0] == mtime else [
                    c.name for c in os.scandir(pod_dir.path) if c.is_dir()]
            except OSError:
                continue  # removed meanwhile (container GC)
            seen_pods[pod_dir.path] = (mtime, names)
            for name in names:
                got = self._container(os.path.join(pod_dir.path, name), containers, seen)
                if got is not None:
                    out[(parts[2], name)] = got
        with self._lock:
            self._pods, self._containers = seen_pods, seen
        return out

    @staticmethod
    def _scan(path: str, mtime: int) -> tuple[int, str, int, int]:
        live, live_count, frozen, files = "", -1, 0, 0
        sizes: dict[str, int] = {}
        for f in os.scandir(path):
            if f.is_file():
                sizes[f.name] = f.stat().st_size
                stem = f.name.removesuffix(".log")
                if stem != f.name and stem.isdigit() and int(stem) > live_count:
                    live, live_count = f.name, int(stem)
        for name, size in sizes.items():
            if name != live:
                frozen += size
            files += 1
        return mtime, live, frozen, files

    def _container(self, path: str, cache: dict[str, tuple[int, str, int, int]],
                   seen: dict[str, tuple[int, str, int, int]]) -> tuple[int, int] | None:
        try:
            mtime = os.stat(path).st_mtime_ns
            cached = cache.get(path)
            entry = cached if cached is not None and cached[0] == mtime else self._scan(path,
                                                                                        mtime)
            try:
                live = os.stat(os.path.join(path, entry[1])).st_size if entry[1] else 0
            except FileNotFoundError:  # rotated since: list the folder again
                entry = self._scan(path, mtime)
                live = os.stat(os.path.join(path, entry[1])).st_size if entry[1] else 0
        except OSError:
            return None  # removed meanwhile (container GC), or rotated twice: next scrape
        seen[path] = entry
        return entry[2] + live, entry[3]


_LOG_DIRS = _LogDirs()


def log_usage(pod_logs: str) -> dict[tuple[str, str], tuple[int, int]]:
    """(pod UID, container name) -> (bytes, files) of the container's log directory
    ``<pod_logs>/<namespace>_<name>_<uid>/<container>/``, rotated files included (``_LogDirs``
    remembers what cannot have changed since the previous call)."""
    return _LOG_DIRS.usage(pod_logs)


def image_fs_stats(info: pb.ImageFsInfoResponse) -> dict[str, Any] | None:
    """``node.runtime.imageFs`` from CRI ImageFsInfo (the first image file system)."""
    if not info.image_filesystems:
        return None
    fs = info.image_filesystems[0]
    out: dict[str, Any] = {"time": rfc3339(fs.timestamp), "usedBytes": fs.used_bytes.value,
                           "inodesUsed": fs.inodes_used.value}
    mount = fs.fs_id.mountpoint
    if mount:
        try:
            st = os.statvfs(mount)
        except OSError:
            return out
        out.update(capacityBytes=st.f_blocks * st.f_frsize,
                   availableBytes=st.f_bavail * st.f_frsize,
                   inodes=st.f_files, inodesFree=st.f_favail)
    return out


def summary(node_name: str, node_start_ns: int, node: dict[str, Any],
            stats: list[pb.ContainerStats], pleg: Mapping[str, Any],
            logs: Mapping[tuple[str, str], tuple[int, int]] | None = None,
            image_fs: dict[str, Any] | None = None, now_ns: int = 0) -> dict[str, Any]:
    """``logs``: ``log_usage``'s answer; ``image_fs``: ``image_fs_stats``'s (``now_ns``
    stamps the logs' figures)."""
    created: dict[str, int] = {}  # sandbox / container id -> created_at (ns)
    pod_created: dict[str, int] = {}
    for uid, record in pleg.items():
        if not isinstance(record, PlegPod):
            continue
        for sb in record.sandboxes:
            if sb.state == "SANDBOX_READY":
                pod_created[uid] = sb.created_at
        for c in record.containers:
            created[c.id] = c.created_at
    pods: dict[str, dict[str, Any]] = {}
    logs = logs or {}
    for st in stats:
        attrs = st.attributes
        labels = attrs.labels
        uid = labels.get(POD_UID, "")
        if not uid or not st.HasField("cpu"):
            continue  # not a pod's, or not running (terminated instances are left out)
        pod = pods.get(uid)
        if pod is None:
            pod = pods[uid] = {
                "podRef": {"name": labels.get(POD_NAME, ""),
                           "namespace": labels.get(POD_NS, ""), "uid": uid},
                "startTime": rfc3339(pod_created[uid]) if uid in pod_created else None,
                "containers": []}
        name, cid = attrs.metadata.name, attrs.id
        container: dict[str, Any] = {
            "name": name, "startTime": rfc3339(created[cid]) if cid in created else None}
        cpu = _cpu(st)
        if cpu is not None:
            container["cpu"] = cpu
        memory = _memory(st)
        if memory is not None:
            container["memory"] = memory
        if st.HasField("writable_layer"):
            layer = st.writable_layer
            container["rootfs"] = {"time": rfc3339(layer.timestamp),
                                   "usedBytes": layer.used_bytes.value}
        used = logs.get((uid, name))
        if used is not None:
            container["logs"] = {"time": rfc3339(now_ns), "usedBytes": used[0],
                                 "inodesUsed": used[1]}
        pod["containers"].append(container)
    items = []
    for pod in pods.values():
        containers = pod["containers"]
        if len(containers) > 1:
            containers.sort(key=lambda c: c["name"])
        cpu = _sum([c["cpu"] for c in containers if "cpu" in c],
                   ("usageNanoCores", "usageCoreNanoSeconds"))
        mem = _sum([c["memory"] for c in containers if "memory" in c],
                   ("usageBytes", "workingSetBytes", "rssBytes"))
        if cpu is not None:
            pod["cpu"] = cpu
        if mem is not None:
            pod["memory"] = mem
        items.append(pod)
    items.sort(key=lambda p: (p["podRef"]["namespace"], p["podRef"]["name"]))
    node_out = {"nodeName": node_name, "startTime": rfc3339(node_start_ns), **node}
    if image_fs is not None:
        node_out["runtime"] = {**node_out.get("runtime", {}), "imageFs": image_fs}
    return {"node": node_out, "pods": items}
