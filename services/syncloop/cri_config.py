"""Pure builders of the CRI configs for a pod: ``PodSandboxConfig`` and ``ContainerConfig``.

hostNetwork pods get the node's network namespace and an empty hostname; the PID namespace mode
is CONTAINER for the sandbox and every container (what containerd needs here); the sandbox's
``cgroup_parent`` is the pod's cgroup under ``cgroupRoot`` (``podcgroups``). Labels,
annotations and log paths follow ``labels``. Volume host paths: emptyDir under
``<rootDir>/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>``, hostPath as given.
"""

from __future__ import annotations

from pathlib import Path

from cri_api.v1 import api_pb2 as pb

from podvisor.services.pod import Container, EmptyDirVolume, HostPathVolume, Pod, PortProtocol
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.spec import container_hash

_PROTOCOLS = {PortProtocol.TCP: pb.TCP, PortProtocol.UDP: pb.UDP, PortProtocol.SCTP: pb.SCTP}
CPU_PERIOD_US = 100_000


def empty_dir_path(pods_dir: Path, uid: str, volume: str) -> Path:
    return pods_dir / uid / "volumes" / "kubernetes.io~empty-dir" / volume


def volume_paths(pod: Pod, pods_dir: Path) -> dict[str, Path]:
    """Volume name -> host path."""
    out: dict[str, Path] = {}
    for v in pod.spec.volumes:
        if isinstance(v.source, EmptyDirVolume):
            out[v.name] = empty_dir_path(pods_dir, pod.uid, v.name)
        elif isinstance(v.source, HostPathVolume):
            out[v.name] = Path(v.source.path)
    return out


def host_ports(pod: Pod) -> list[tuple[str, int]]:
    """(protocol, host port) pairs the pod claims on the node."""
    out: list[tuple[str, int]] = []
    for c in pod.all_containers():
        for p in c.ports:
            port = p.host_port or (p.container_port if pod.spec.host_network else 0)
            if port:
                out.append((str(p.protocol), port))
    return out


def sandbox_config(pod: Pod, attempt: int, pod_logs_dir: Path,
                   cgroup_parent: str = "") -> pb.PodSandboxConfig:
    """``cgroup_parent``: the pod's cgroup (``<cgroupRoot>/pod<uid>``), "" = the runtime's."""
    host_net = pod.spec.host_network
    ns = pb.NamespaceOption(network=pb.NODE if host_net else pb.POD, pid=pb.CONTAINER,
                            ipc=pb.POD)
    mappings = [
        pb.PortMapping(protocol=_PROTOCOLS[p.protocol], container_port=p.container_port,
                       host_port=p.host_port or (p.container_port if host_net else 0))
        for c in pod.all_containers() for p in c.ports
        if p.host_port or host_net
    ]
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=pod.name, uid=pod.uid, namespace=pod.namespace,
                                       attempt=attempt),
        hostname="" if host_net else pod.name[:63],
        log_directory=str(L.pod_log_dir(pod_logs_dir, pod.name, pod.namespace, pod.uid)),
        port_mappings=mappings,
        labels={**pod.metadata.labels, **L.pod_labels(pod.name, pod.namespace, pod.uid)},
        annotations=dict(pod.metadata.annotations),
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=cgroup_parent,
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=ns)),
    )


def _resources(c: Container) -> pb.LinuxContainerResources:
    res = pb.LinuxContainerResources()
    if c.resources.limits.memory_bytes is not None:
        res.memory_limit_in_bytes = c.resources.limits.memory_bytes
    if c.resources.limits.cpu_millis is not None:
        res.cpu_period = CPU_PERIOD_US
        res.cpu_quota = max(1000, c.resources.limits.cpu_millis * CPU_PERIOD_US // 1000)
    if c.resources.requests.cpu_millis is not None:
        res.cpu_shares = max(2, c.resources.requests.cpu_millis * 1024 // 1000)
    return res


def _mounts(c: Container, volumes: dict[str, Path]) -> list[pb.Mount]:
    out = []
    for m in c.volume_mounts:
        host = volumes[m.name]
        if m.sub_path:
            host = host / m.sub_path
        out.append(pb.Mount(container_path=m.mount_path, host_path=str(host),
                            readonly=m.read_only))
    return out


def container_config(pod: Pod, c: Container, restart_count: int,
                     volumes: dict[str, Path]) -> pb.ContainerConfig:
    """Raises KeyError when a mount names a volume the pod does not declare."""
    ns = pb.NamespaceOption(network=pb.NODE if pod.spec.host_network else pb.POD,
                            pid=pb.CONTAINER, ipc=pb.POD)
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=c.name, attempt=restart_count),
        image=pb.ImageSpec(image=c.image, user_specified_image=c.image),
        command=list(c.command), args=list(c.args), working_dir=c.working_dir,
        envs=[pb.KeyValue(key=e.name, value=e.value) for e in c.env],
        mounts=_mounts(c, volumes),
        labels=L.container_labels(pod.name, pod.namespace, pod.uid, c.name),
        annotations=L.container_annotations(container_hash(c), restart_count,
                                            pod.spec.termination_grace_period_seconds),
        log_path=L.container_log_path(c.name, restart_count),
        linux=pb.LinuxContainerConfig(
            resources=_resources(c),
            security_context=pb.LinuxContainerSecurityContext(namespace_options=ns)),
    )
