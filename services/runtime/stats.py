"""Container stats, with usage_nano_cores from the previous sample of the same container.

A container with a cgroup (cgroups.py: it asked for resources) is read from it as the kubelet's
cAdvisor does: CPU from cpuacct.usage (v2 cpu.stat usage_usec), memory usage, working set =
usage - inactive_file, rss. Others from their process group (/proc: one pass over every
process's ``stat`` per collect, summing user + system time and resident pages per group of a
running container, ``procfs.GroupScanner``, which reads again only the processes that were in
a wanted group at the previous pass, all of them every 30 s): working set = usage = rss there.
A container's cgroup folders are looked up once (they never change) and forgotten with the
container.

Cost (bench/mainport.py, bench/stats_profile.py; 110 pods): the /proc pass is the bulk of a
collect; it used to read every process's ``stat`` and build a psutil ``Process`` per member on
top (three more /proc reads each)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from cri_api.v1 import api_pb2 as pb

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.services.runtime.cgroups import Usage
from podvisor.services.runtime.model import Container, ContainerState
from podvisor.services.runtime.procfs import GroupScanner


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
        self._dirs: dict[str, Mapping[str, str]] = {}  # container id -> its cgroup folders
        self._attrs: dict[str, pb.ContainerAttributes] = {}  # container id -> its attributes
        self._scanner = GroupScanner()  # under _scan_lock (gRPC calls come on many threads)
        self._scan_lock = threading.Lock()

    def _cgroup_dirs(self, container_id: str) -> Mapping[str, str]:
        with self._lock:
            dirs = self._dirs.get(container_id)
        if dirs is None:
            dirs = self._cgroup_of(container_id)
            with self._lock:
                self._dirs[container_id] = dirs
        return dirs

    def collect(self, containers: list[Container]) -> list[pb.ContainerStats]:
        usages: dict[str, Usage] = {}
        by_group: dict[int, str] = {}  # process group -> container id (no readable cgroup)
        for c in containers:
            if c.state is not ContainerState.RUNNING or c.started is None:
                continue
            dirs = self._cgroup_dirs(c.id)
            usage = self._read_cgroup(dirs) if dirs else None
            if usage is None:
                by_group[c.started.pid] = c.id
            else:
                usages[c.id] = usage
        if by_group:
            with self._scan_lock:
                groups = self._scanner.usage(set(by_group), self._wall() / 1e9)
            for pgid, cid in by_group.items():
                cpu, rss = groups.get(pgid, (0, 0))
                usages[cid] = Usage(cpu, rss, rss, rss)
        return [self._one(c, usages.get(c.id)) for c in containers]

    def _attributes(self, c: Container) -> pb.ContainerAttributes:
        """The container's attributes, built once (its config never changes)."""
        with self._lock:
            attrs = self._attrs.get(c.id)
        if attrs is None:
            attrs = pb.ContainerAttributes(id=c.id, metadata=c.config.metadata,
                                           labels=c.config.labels,
                                           annotations=c.config.annotations)
            with self._lock:
                self._attrs[c.id] = attrs
        return attrs

    def _one(self, c: Container, usage: Usage | None) -> pb.ContainerStats:
        # fields set in place: no temporary messages built and copied in
        now = self._wall()
        stats = pb.ContainerStats()
        stats.attributes.CopyFrom(self._attributes(c))
        layer = stats.writable_layer
        layer.timestamp = now
        layer.used_bytes.value = 0
        layer.inodes_used.value = 0
        if usage is None:  # not running
            return stats
        cpu_ns = usage.cpu_ns
        with self._lock:
            prev = self._last.get(c.id)
            self._last[c.id] = (now, cpu_ns)
        nano_cores = 0
        if prev is not None and now > prev[0]:
            nano_cores = max(cpu_ns - prev[1], 0) * 1_000_000_000 // (now - prev[0])
        cpu = stats.cpu
        cpu.timestamp = now
        cpu.usage_core_nano_seconds.value = cpu_ns
        cpu.usage_nano_cores.value = nano_cores
        memory = stats.memory
        memory.timestamp = now
        memory.working_set_bytes.value = usage.working_set_bytes
        memory.rss_bytes.value = usage.rss_bytes
        memory.usage_bytes.value = usage.memory_bytes
        return stats

    def forget(self, container_id: str) -> None:
        with self._lock:
            self._last.pop(container_id, None)
            self._dirs.pop(container_id, None)
            self._attrs.pop(container_id, None)

