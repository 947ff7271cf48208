"""What each active pod uses, read from the machine (the kubelet's summary API, over files):
memory from the pod's cgroup (its containers' from theirs; v1 or v2, ``cgroups.py``), storage
from its emptyDir folders and log folder, processes from its cgroup. Read once per pass; a pod
or container that is gone reads as 0."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from podvisor.ipc.maps import DesiredPod, PlegPod
from podvisor.services.eviction.cgroups import MemoryCgroups
from podvisor.services.eviction.rank import CRITICAL_PRIORITY, ContainerUsage, PodUsage
from podvisor.services.pod import EmptyDirVolume, Pod, StorageMedium, pod_from_wire
from podvisor.services.syncloop import empty_dir_path, pod_cgroup_parent, pod_log_dir

API_SOURCE = "api"


def tree_usage(path: Path) -> tuple[int, int]:
    """(bytes, inodes) under ``path`` (du's view: allocated blocks; hard links once)."""
    total = inodes = 0
    seen: set[tuple[int, int]] = set()
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
            inodes += 1
    return total, inodes


def pids_in(folder: Path) -> int:
    """Processes in a cgroup folder and the folders under it."""
    count = 0
    for root, _dirs, files in os.walk(folder):
        if "cgroup.procs" in files:
            try:
                count += len((Path(root) / "cgroup.procs").read_text().split())
            except OSError:
                continue
    return count


def is_critical(pod: Pod, source: str) -> bool:
    """The kubelet's ``IsCriticalPod``: a static pod (a file or HTTP source's), a mirror
    pod, or priority at least system-cluster-critical's."""
    return source != API_SOURCE or pod.spec.priority >= CRITICAL_PRIORITY


class UsageReader:
    """Reads ``PodUsage`` for the active pods of the ``desired`` map."""

    def __init__(self, cgroups: MemoryCgroups, cgroup_root: str, pods_dir: Path,
                 pod_logs_dir: Path) -> None:
        self.cgroups, self.cgroup_root = cgroups, cgroup_root
        self.pods_dir, self.pod_logs_dir = pods_dir, pod_logs_dir

    def cgroup(self, uid: str, qos: str) -> Path | None:
        """The pod's memory folder on this host's hierarchy (its processes' ``cgroup.procs``
        are there on v1 and v2 alike)."""
        parent = pod_cgroup_parent(self.cgroup_root, uid, qos)
        return self.cgroups.folder(parent) if parent else None

    def read(self, desired: Mapping[str, DesiredPod], pleg: Mapping[str, PlegPod]
             ) -> list[PodUsage]:
        return [self.pod_usage(d, pleg.get(uid)) for uid, d in desired.items()
                if d.active and not d.failed]

    def pod_usage(self, d: DesiredPod, record: PlegPod | None) -> PodUsage:
        pod = pod_from_wire(d.pod, "desired")
        folder = self.cgroup(pod.uid, d.qos_class)
        running = {c.name: c.id for c in (record.containers if record else ())
                   if c.state == "CONTAINER_RUNNING"}
        logs = pod_log_dir(self.pod_logs_dir, pod.name, pod.namespace, pod.uid)
        containers = []
        for c in pod.spec.containers:
            cid = running.get(c.name)
            memory = self.cgroups.working_set(folder / cid) if folder is not None and cid else 0
            storage, _ = tree_usage(logs / c.name)
            containers.append(ContainerUsage(
                c.name, c.resources.requests.memory_bytes or 0, memory,
                c.resources.requests.ephemeral_storage_bytes or 0, storage,
                c.resources.limits.ephemeral_storage_bytes))
        volumes = []
        volume_bytes = volume_inodes = 0
        for v in pod.spec.volumes:
            src = v.source
            if not isinstance(src, EmptyDirVolume) or src.medium == StorageMedium.MEMORY:
                continue
            used, inodes = tree_usage(empty_dir_path(self.pods_dir, pod.uid, v.name))
            volume_bytes += used
            volume_inodes += inodes
            volumes.append((v.name, used, src.size_limit_bytes))
        log_bytes, log_inodes = tree_usage(logs)
        return PodUsage(
            uid=pod.uid, name=f"{pod.namespace}/{pod.name}", priority=pod.spec.priority,
            qos=d.qos_class, critical=is_critical(pod, d.source),
            memory=self.cgroups.working_set(folder) if folder is not None else 0,
            storage=log_bytes + volume_bytes, inodes=log_inodes + volume_inodes,
            pids=pids_in(folder) if folder is not None else 0,
            containers=tuple(containers), volumes=tuple(volumes),
            termination_grace=pod.spec.termination_grace_period_seconds)


def active_pods(items: Iterable[tuple[str, object]]) -> dict[str, DesiredPod]:
    """The ``desired`` map's pod entries (its ``_runtime`` entry aside)."""
    return {k: v for k, v in items if isinstance(v, DesiredPod)}
