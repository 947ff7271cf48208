"""The supervised entry ``podvisor.services.runtime.main.run(ctx)``: serves on
``paths.cri_socket``, heartbeats while its gRPC server answers, returns when ``ctx.stop`` is set;
a server that stops answering (its handler pool wedged) silences the heartbeat, and the
supervisor restarts the process as hung. Also served in-process through the package's front
door, as ``podvisorctl shutdown --pods`` does without an agent."""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb
from cri_api.v1 import api_pb2_grpc as pb_grpc

from podvisor.common import FakeChildContext
from podvisor.ipc.paths import RunPaths
from podvisor.services.cri import CriError, new_runtime_client
from podvisor.services.runtime import serve_in_process
from podvisor.services.runtime.jsonlog import JsonLogger
from podvisor.services.runtime.main import run
from podvisor.services.runtime.server import MAX_WORKERS


@pytest.fixture
def paths() -> Iterator[RunPaths]:
    root = Path(tempfile.mkdtemp(prefix="pvsvc", dir="/tmp"))
    paths = RunPaths(root)
    paths.ensure()
    yield paths
    shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _serve(target: Any, ctx: Any, paths: RunPaths, poll: Any) -> Iterator[Any]:
    thread = threading.Thread(target=target, args=(ctx,))
    thread.start()
    client = new_runtime_client(f"unix://{paths.cri_socket}", timeout=5.0)
    try:
        def up() -> bool:
            try:
                return client.version().runtime_api_version == "v1"
            except CriError:
                return False
        poll(up, message="runtime to serve on paths.cri_socket")
        yield client
    finally:
        ctx.stop.set()
        thread.join(15)
        client.close()
    assert not thread.is_alive()
    assert not paths.cri_socket.exists()


def test_run_serves_heartbeats_and_stops(paths: RunPaths, poll: Any) -> None:
    ctx = FakeChildContext(paths, "runtime", heartbeat_interval=0.05)
    with _serve(run, ctx, paths, poll) as client:
        poll(lambda: ctx.beats >= 2, message="heartbeats")
        sid = client.run_pod_sandbox(pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name="p", namespace="n", uid="u")))
        assert f'"id":"{sid}"' in (paths.runtime_dir / "meta.jsonl").read_text()


def test_served_in_process_through_the_front_door(paths: RunPaths, poll: Any) -> None:
    """``serve_in_process`` (what podvisorctl's agent-less ``shutdown --pods`` uses): the same
    server on this process's threads while the block runs; the socket goes when it ends."""
    with serve_in_process(paths.runtime_dir, paths.cri_socket, JsonLogger("runtime")):
        client = new_runtime_client(f"unix://{paths.cri_socket}", timeout=5.0)
        try:
            assert client.version().runtime_api_version == "v1"
        finally:
            client.close()
    assert not paths.cri_socket.exists()


def test_a_wedged_server_is_judged_hung_and_restarted(agent: Any, poll: Any) -> None:
    """Every handler thread of the gRPC server blocked (pulls from a registry that accepts
    connections and never answers): the runtime's main thread is fine, but the server answers
    nothing, so the process stops heartbeating and the supervisor restarts it."""
    a = agent(processes={"runtime": {"module": "podvisor.services.runtime.main",
                                     "heartbeatTimeout": "2s", "stopTimeout": "2s"}})
    before = a.wait_state("runtime", "RUNNING")
    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(4 * MAX_WORKERS)  # connections complete in the kernel; never accepted
    host = f"127.0.0.1:{blackhole.getsockname()[1]}"
    channel = grpc.insecure_channel(f"unix://{a.paths.cri_socket}")
    images = pb_grpc.ImageServiceStub(channel)
    pulls: list[Any] = []
    try:
        poll(lambda: _answers(channel), 30.0, "the supervised runtime to serve CRI")
        pulls = [images.PullImage.future(
            pb.PullImageRequest(image=pb.ImageSpec(image=f"{host}/wedge/n{i}:1")), timeout=60)
            for i in range(MAX_WORKERS + 8)]
        after = a.wait_state("runtime", "RUNNING", timeout=60.0,
                             where=lambda row: row["pid"] != before["pid"])
        assert after["restarts"] >= 1
        assert "no heartbeat for 2s" in str(after["lastExit"])
        poll(lambda: _answers(channel), 30.0, "the restarted runtime to serve CRI")
    finally:
        for call in pulls:
            call.cancel()
        channel.close()
        blackhole.close()


def _answers(channel: grpc.Channel) -> bool:
    try:
        pb_grpc.RuntimeServiceStub(channel).Version(pb.VersionRequest(), timeout=1.0)
    except grpc.RpcError:
        return False
    return True
