"""Container stats, with usage_nano_cores from the previous sample of the same container.

A container with a cgroup (cgroups.py: it asked for resources) is read from it as the kubelet's
cAdvisor does: CPU from cpuacct.usage (v2 cpu.stat usage_usec), memory usage, working set =
usage - inactive_file, rss. Others from their process group (psutil over /proc): working set =
usage = rss there."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

import psutil
from cri_api.v1 import api_pb2 as pb

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.services.runtime.cgroups import Usage
from podvisor.services.runtime.model import Container, ContainerState
from podvisor.services.runtime.procfs import group_members


class StatsCollector:
    def __init__(self, wall: Callable[[], int] = SYSTEM_CLOCK.wall_ns,
                 cgroup_of: Callable[[str], Mapping[str, str]] = lambda _id: {},
                 read_cgroup: Callable[[Mapping[str, str]], Usage | None] = lambda _d: None,
                 ) -> None:
        """``cgroup_of``: a container's cgroup folders ({} for none); ``read_cgroup``: their
        usage (None when unreadable: /proc is read instead)."""
        self._wall = wall
        self._cgroup_of = cgroup_of
        self._read_cgroup = read_cgroup
        self._lock = threading.Lock()
        self._last: dict[str, tuple[int, int]] = {}  # container id -> (ts ns, cpu ns)

    def collect(self, containers: list[Container]) -> list[pb.ContainerStats]:
        groups = group_members() if any(
            c.state is ContainerState.RUNNING for c in containers) else {}
        return [self._one(c, groups) for c in containers]

    def _one(self, c: Container, groups: dict[int, list[int]]) -> pb.ContainerStats:
        attrs = pb.ContainerAttributes(id=c.id, metadata=c.config.metadata,
                                       labels=c.config.labels, annotations=c.config.annotations)
        now = self._wall()
        stats = pb.ContainerStats(
            attributes=attrs,
            writable_layer=pb.FilesystemUsage(timestamp=now, used_bytes=pb.UInt64Value(value=0),
                                              inodes_used=pb.UInt64Value(value=0)),
        )
        if c.state is not ContainerState.RUNNING or c.started is None:
            return stats
        dirs = self._cgroup_of(c.id)
        usage = self._read_cgroup(dirs) if dirs else None
        if usage is None:
            usage = _from_proc(groups.get(c.started.pid, []))
        cpu_ns = usage.cpu_ns
        with self._lock:
            prev = self._last.get(c.id)
            self._last[c.id] = (now, cpu_ns)
        nano_cores = 0
        if prev is not None and now > prev[0]:
            nano_cores = max(cpu_ns - prev[1], 0) * 1_000_000_000 // (now - prev[0])
        stats.cpu.CopyFrom(pb.CpuUsage(
            timestamp=now, usage_core_nano_seconds=pb.UInt64Value(value=cpu_ns),
            usage_nano_cores=pb.UInt64Value(value=nano_cores)))
        stats.memory.CopyFrom(pb.MemoryUsage(
            timestamp=now, working_set_bytes=pb.UInt64Value(value=usage.working_set_bytes),
            rss_bytes=pb.UInt64Value(value=usage.rss_bytes),
            usage_bytes=pb.UInt64Value(value=usage.memory_bytes)))
        return stats

    def forget(self, container_id: str) -> None:
        with self._lock:
            self._last.pop(container_id, None)


def _from_proc(pids: list[int]) -> Usage:
    cpu_ns, rss = 0, 0
    for pid in pids:
        try:
            p = psutil.Process(pid)
            with p.oneshot():
                t = p.cpu_times()
                cpu_ns += int((t.user + t.system) * 1e9)
                rss += p.memory_info().rss
        except psutil.Error:
            continue
    return Usage(cpu_ns, rss, rss, rss)
