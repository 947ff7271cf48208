"""The embedded runtime's list answers are joined cached wire bytes: they must be exactly what
protobuf would send for the same items."""

from __future__ import annotations

import shutil
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import new_runtime_client
from podvisor.services.runtime import convert
from podvisor.services.runtime.model import Container, Sandbox, SandboxState
from podvisor.services.runtime.servicer import _ItemCache
from tests.services.conftest import short_tmp


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


def test_cri_socket_exists_only_once_it_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients wait for the socket file, then connect: the server binds a temporary name and
    renames it into place after it listens, so the file never refuses a connection."""
    from podvisor.common.logs import MemoryLogger
    from podvisor.services.runtime import server as server_module

    base = short_tmp("pvsock")
    sock = base / "cri.sock"
    seen: list[bool] = []
    real = server_module.grpc.server

    def spy(*args: Any, **kwargs: Any) -> Any:
        srv = real(*args, **kwargs)
        start = srv.start

        def starting() -> None:
            seen.append(sock.exists())
            start()
        srv.start = starting
        return srv
    monkeypatch.setattr(server_module.grpc, "server", spy)
    rs = server_module.RuntimeServer(base / "root", sock, MemoryLogger())
    try:
        rs.start()
        assert seen == [False] and sock.exists()
        assert [p.name for p in base.iterdir() if p.name.startswith(".")] == []
        client = new_runtime_client(f"unix://{sock}", timeout=5.0)
        try:
            assert client.version().runtime_name == "podvisor-embedded"
        finally:
            client.close()
    finally:
        rs.stop()
        shutil.rmtree(base, ignore_errors=True)
