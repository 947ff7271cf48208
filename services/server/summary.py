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
every restart's files and rotated ones (gzipped included) counted (``logusage.py``).
``summarymaker.py`` puts the parts together for the main port.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import psutil
from cri_api.v1 import api_pb2 as pb

from podvisor.common.labels import POD_NAME, POD_NAMESPACE, POD_UID
from podvisor.common.timefmt import rfc3339
from podvisor.ipc.maps import PlegPod
from podvisor.services.server.logusage import log_usage

__all__ = ["ContainerRef", "NodeSampler", "container_refs", "image_fs_stats", "log_usage",
           "start_times", "summary"]

NS = 1_000_000_000  # CRI timestamps are nanoseconds; metav1.Time is to the second


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
        stamp = rfc3339(now_ns // NS)
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
    return {"time": rfc3339(stats.cpu.timestamp // NS),
            "usageNanoCores": stats.cpu.usage_nano_cores.value,
            "usageCoreNanoSeconds": stats.cpu.usage_core_nano_seconds.value}


def _memory(stats: pb.ContainerStats) -> dict[str, Any] | None:
    if not stats.HasField("memory"):
        return None
    m = stats.memory
    return {"time": rfc3339(m.timestamp // NS), "usageBytes": m.usage_bytes.value,
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


def image_fs_stats(info: pb.ImageFsInfoResponse) -> dict[str, Any] | None:
    """``node.runtime.imageFs`` from CRI ImageFsInfo (the first image file system)."""
    if not info.image_filesystems:
        return None
    fs = info.image_filesystems[0]
    out: dict[str, Any] = {"time": rfc3339(fs.timestamp // NS), "usedBytes": fs.used_bytes.value,
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


class ContainerRef(NamedTuple):
    """A running container's pod and name, from its attributes (they never change)."""

    uid: str
    namespace: str
    pod: str
    name: str


def container_refs(stats: Sequence[pb.ContainerStats],
                   memo: dict[str, ContainerRef | None] | None = None
                   ) -> list[ContainerRef | None]:
    """Each stats entry's ``ContainerRef``, None for one not running or no pod's. ``memo``
    (container ID -> ref) is read and left holding this answer's containers only: a
    container's labels are read once, not at every scrape (a CRI container ID names one
    container for good: the embedded runtime's and containerd's are random 256-bit IDs)."""
    old = memo if memo is not None else {}
    new: dict[str, ContainerRef | None] = {}
    out: list[ContainerRef | None] = []
    for st in stats:
        if not st.HasField("cpu"):
            out.append(None)  # not running (terminated instances are left out)
            continue
        attrs = st.attributes
        cid = attrs.id
        if cid in old:
            ref = old[cid]
        else:
            labels = attrs.labels
            uid = labels.get(POD_UID, "")
            ref = ContainerRef(uid, labels.get(POD_NAMESPACE, ""), labels.get(POD_NAME, ""),
                               attrs.metadata.name) if uid else None
        new[cid] = ref
        out.append(ref)
    if memo is not None:
        memo.clear()
        memo.update(new)
    return out


def start_times(pleg: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """(container ID -> created_at, pod UID -> its ready sandbox's created_at), in ns."""
    created: dict[str, int] = {}
    pod_created: dict[str, int] = {}
    for uid, record in pleg.items():
        if not isinstance(record, PlegPod):
            continue
        for sb in record.sandboxes:
            if sb.state == "SANDBOX_READY":
                pod_created[uid] = sb.created_at
        for c in record.containers:
            created[c.id] = c.created_at
    return created, pod_created


def summary(node_name: str, node_start_ns: int, node: dict[str, Any],
            stats: list[pb.ContainerStats], pleg: Mapping[str, Any],
            logs: Mapping[tuple[str, str], tuple[int, int]] | None = None,
            image_fs: dict[str, Any] | None = None, now_ns: int = 0,
            refs: Sequence[ContainerRef | None] | None = None,
            starts: tuple[dict[str, int], dict[str, int]] | None = None) -> dict[str, Any]:
    """``logs``: ``LogUsage``'s answer; ``image_fs``: ``image_fs_stats``'s (``now_ns``
    stamps the logs' figures); ``refs``: ``container_refs(stats)`` and ``starts``:
    ``start_times(pleg)`` when the caller has them already."""
    created, pod_created = starts if starts is not None else start_times(pleg)
    pods: dict[str, dict[str, Any]] = {}
    logs = logs or {}
    logs_time = rfc3339(now_ns // NS)
    for st, ref in zip(stats, refs if refs is not None else container_refs(stats), strict=True):
        if ref is None:
            continue  # not a pod's, or not running
        uid = ref.uid
        pod = pods.get(uid)
        if pod is None:
            pod = pods[uid] = {
                "podRef": {"name": ref.pod, "namespace": ref.namespace, "uid": uid},
                "startTime": rfc3339(pod_created[uid] // NS) if uid in pod_created else None,
                "containers": []}
        cid = st.attributes.id
        container: dict[str, Any] = {
            "name": ref.name, "startTime": rfc3339(created[cid] // NS) if cid in created else None}
        cpu = _cpu(st)
        if cpu is not None:
            container["cpu"] = cpu
        memory = _memory(st)
        if memory is not None:
            container["memory"] = memory
        if st.HasField("writable_layer"):
            layer = st.writable_layer
            container["rootfs"] = {"time": rfc3339(layer.timestamp // NS),
                                   "usedBytes": layer.used_bytes.value}
        used = logs.get((uid, ref.name))
        if used is not None:
            container["logs"] = {"time": logs_time, "usedBytes": used[0],
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
    node_out = {"nodeName": node_name, "startTime": rfc3339(node_start_ns // NS), **node}
    if image_fs is not None:
        node_out["runtime"] = {**node_out.get("runtime", {}), "imageFs": image_fs}
    return {"node": node_out, "pods": items}
