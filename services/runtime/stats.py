"""Container stats, with usage_nano_cores from the previous sample of the same container.

A container with a cgroup (cgroups.py: it asked for resources) is read from it as the kubelet's
cAdvisor does: CPU from cpuacct.usage (v2 cpu.stat usage_usec), memory usage, working set =
usage - inactive_file, rss. Others from their process group (``groupscan.GroupScanner``: each
member's ``/proc/<pid>/stat``, user + system time and resident pages summed per group of a
running container; members found through the kernel's children lists, /proc listed in full
every 30 s): working set = usage = rss there. A container's cgroup folders are looked up once
(they never change) and forgotten with the container.

Cost (bench/mainport.py, bench/stats_profile.py; 110 pods): the /proc reads are the bulk of a
collect (they used to build a psutil ``Process`` per member, three more reads each, and to list
/proc at every collect). ListContainerStats answers with ``collect_wire``'s bytes (server.py
passes them through): cached attributes and one reused message for the figures, where
building, copying and serializing a message per container cost nearly as much as the reads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from cri_api.v1 import api_pb2 as pb

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.services.runtime.cgroups import Usage
from podvisor.services.runtime.convert import field1
from podvisor.services.runtime.groupscan import GroupScanner
from podvisor.services.runtime.model import Container, ContainerState


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
        # container id -> its attributes as ContainerStats' field 1, serialized
        self._attrs_wire: dict[str, bytes] = {}
        # the figures of one container at a time, serialized (under _lock): running, idle
        self._sample = pb.ContainerStats()
        self._idle = pb.ContainerStats()
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
        usages = self._usages(containers)
        return [self._one(c, usages.get(c.id)) for c in containers]

    def collect_wire(self, containers: list[Container]) -> bytes:
        """``collect``'s answer as a serialized ``ListContainerStatsResponse``: each item is
        the container's attributes, serialized once (they never change), then its figures
        set in place in one reused message and serialized; no message per container built,
        copied into and serialized again (the list answer's bulk)."""
        usages = self._usages(containers)
        out = []
        for c in containers:
            with self._lock:
                attrs = self._attrs_wire.get(c.id)
            if attrs is None:
                attrs = field1(self._attributes(c).SerializeToString())
                with self._lock:
                    self._attrs_wire[c.id] = attrs
            with self._lock:
                figures = self._fill(self._sample, self._idle, c, usages.get(c.id))
                out.append(field1(attrs + figures.SerializeToString()))
        return b"".join(out)

    def _usages(self, containers: list[Container]) -> dict[str, Usage]:
        """Running containers' usage: from their cgroup when readable, else from /proc."""
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
        return usages

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
        stats = pb.ContainerStats()
        with self._lock:
            self._fill(stats, stats, c, usage)
        stats.attributes.CopyFrom(self._attributes(c))
        return stats

    def _fill(self, stats: pb.ContainerStats, idle: pb.ContainerStats, c: Container,
              usage: Usage | None) -> pb.ContainerStats:
        """The container's figures (no attributes) set in ``stats``, or in ``idle`` when it
        is not running (a writable layer only); every field either holds is set, so both can
        be reused from container to container. The caller holds _lock."""
        now = self._wall()
        layer = (stats if usage is not None else idle).writable_layer
        layer.timestamp = now
        layer.used_bytes.value = 0
        layer.inodes_used.value = 0
        if usage is None:  # not running
            return idle
        cpu_ns = usage.cpu_ns
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
            self._attrs_wire.pop(container_id, None)

    def close(self) -> None:
        """Close the /proc descriptors the scan keeps open."""
        with self._scan_lock:
            self._scanner.close()
