"""The embedded runtime's list answers are joined cached wire bytes: they must be exactly what
protobuf would send for the same items."""

from __future__ import annotations

from cri_api.v1 import api_pb2 as pb

from podvisor.services.runtime import convert
from podvisor.services.runtime.model import Container, Sandbox, SandboxState
from podvisor.services.runtime.servicer import _ItemCache


def _container(i: int, label_len: int) -> Container:
    config = pb.ContainerConfig(metadata=pb.ContainerMetadata(name=f"c{i}"),
                                image=pb.ImageSpec(image="host"),
                                labels={"big": "x" * label_len})
    return Container(f"{i:064x}", "s" * 64, config, 1000 + i, "", "sha256:host")


def test_list_wire_bytes_equal_protobuf_serialization() -> None:
    cache = _ItemCache()
    # item sizes across the varint length boundaries (1, 2 and 3 bytes)
    items = [_container(i, n) for i, n in enumerate((0, 40, 200, 20000))]
    wire = cache.containers(items)
    want = pb.ListContainersResponse(containers=[convert.container_item(c) for c in items])
    assert pb.ListContainersResponse.FromString(wire) == want
    assert wire == want.SerializeToString()
    assert cache.containers(items) == wire  # cached
    sandboxes = [Sandbox(f"{i:064x}", pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=f"p{i}", namespace="n", uid=f"u{i}"),
        annotations={"a": "y" * n}), 5, SandboxState.READY) for i, n in enumerate((0, 300))]
    swire = cache.sandboxes(sandboxes)
    assert swire == pb.ListPodSandboxResponse(
        items=[convert.sandbox_item(sb) for sb in sandboxes]).SerializeToString()
    assert cache.containers([]) == b""
