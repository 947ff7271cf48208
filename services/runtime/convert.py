"""Records -> runtime.v1 protobuf messages. Pure functions.

Network: with ``networkPlugin: cni`` a sandbox that asked for its own network
(``NamespaceMode.POD``) has a namespace and the IPs CNI gave it (the first is ``ip``, the rest
``additional_ips``). With ``networkPlugin: host`` every sandbox runs in the host's network, and
one that asked for its own reports ``POD_IP``, the loopback address it is reachable on. A
``NODE`` one reports no IP, as containerd does (the kubelet uses the host's IP for those).
"""

from __future__ import annotations

from cri_api.v1 import api_pb2 as pb

from podvisor.services.runtime.model import Container, ContainerState, Sandbox

POD_IP = "127.0.0.1"


def sandbox_item(sb: Sandbox) -> pb.PodSandbox:
    return pb.PodSandbox(
        id=sb.id, metadata=sb.config.metadata, state=sb.state.to_pb(), created_at=sb.created_at,
        labels=sb.config.labels, annotations=sb.config.annotations,
        runtime_handler=sb.runtime_handler,
    )


def sandbox_status(sb: Sandbox) -> pb.PodSandboxStatus:
    ns = sb.config.linux.security_context.namespace_options
    return pb.PodSandboxStatus(
        id=sb.id, metadata=sb.config.metadata, state=sb.state.to_pb(), created_at=sb.created_at,
        network=_network_status(sb, ns.network),
        linux=pb.LinuxPodSandboxStatus(namespaces=pb.Namespace(options=ns)),
        labels=sb.config.labels, annotations=sb.config.annotations,
        runtime_handler=sb.runtime_handler,
    )


def _network_status(sb: Sandbox, mode: int) -> pb.PodSandboxNetworkStatus:
    if sb.network is not None:
        ips = sb.network.ips
        return pb.PodSandboxNetworkStatus(
            ip=ips[0] if ips else "",
            additional_ips=[pb.PodIP(ip=ip) for ip in ips[1:]])
    return pb.PodSandboxNetworkStatus(ip="" if mode == pb.NODE else POD_IP)


def container_item(c: Container) -> pb.Container:
    return pb.Container(
        id=c.id, pod_sandbox_id=c.sandbox_id, metadata=c.config.metadata, image=c.config.image,
        image_ref=c.image_ref, image_id=c.image_ref, state=c.state.to_pb(),
        created_at=c.created_at, labels=c.config.labels, annotations=c.config.annotations,
    )


def container_status(c: Container) -> pb.ContainerStatus:
    status = pb.ContainerStatus(
        id=c.id, metadata=c.config.metadata, state=c.state.to_pb(), created_at=c.created_at,
        image=c.config.image, image_ref=c.image_ref, image_id=c.image_ref,
        labels=c.config.labels, annotations=c.config.annotations, mounts=c.config.mounts,
        log_path=c.log_path, stop_signal=c.config.stop_signal,
    )
    if c.started is not None:
        status.started_at = c.started.started_at
    if c.state is ContainerState.EXITED and c.exited is not None:
        status.finished_at = c.exited.finished_at
        status.exit_code = c.exited.exit_code
        status.reason = c.exited.reason
        status.message = c.exited.message
    return status


def field1(data: bytes) -> bytes:
    """``data`` (a serialized message) as protobuf field 1 (length-delimited): the list
    responses are ``repeated <item> = 1`` only, so their wire form is these pieces joined (and
    ``ContainerStats.attributes`` is its field 1)."""
    n, head = len(data), bytearray(b"\x0a")
    while n > 0x7F:
        head.append(n & 0x7F | 0x80)
        n >>= 7
    head.append(n)
    return bytes(head) + data
