"""The CRI client layer: endpoint parsing, deadlines, the instrumented wrapper, the fake, and a
client nobody here wrote (the ``cri_api`` package's own helpers) against the embedded server."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from cri_api.channel import Channel
from cri_api.containers import Containers
from cri_api.images import Images
from cri_api.v1 import api_pb2 as pb
from prometheus_client import CollectorRegistry, generate_latest

from podvisor.services.cri import (
    CriError,
    OnDemandRuntimeClient,
    new_instrumented_client,
    new_runtime_client,
)
from podvisor.services.cri.containerd import kill_request
from podvisor.services.cri.fake import FakeRuntimeClient
from podvisor.services.cri.grpc_client import normalize_endpoint


@pytest.mark.parametrize(("given", "want"), [
    ("unix:///run/x.sock", "unix:///run/x.sock"),
    ("unix:/run/x.sock", "unix:///run/x.sock"),
    ("/run/x.sock", "unix:///run/x.sock"),
])
def test_normalize_endpoint(given: str, want: str) -> None:
    assert normalize_endpoint(given) == want


@pytest.mark.parametrize("bad", ["tcp://127.0.0.1:1", "unix://relative.sock", "x.sock"])
def test_bad_endpoints_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        normalize_endpoint(bad)


def test_unreachable_runtime_fails_within_the_timeout(tmp_path: Any) -> None:
    client = new_runtime_client(f"unix://{tmp_path}/nothing.sock", timeout=0.5)
    start = time.monotonic()
    with pytest.raises(CriError) as info:
        client.version()
    assert info.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert time.monotonic() - start < 10  # generous: a deadline exists at all
    client.close()


def test_reconnect_backoff_is_the_kubelets(monkeypatch: pytest.MonkeyPatch) -> None:
    """k8s.io/cri-client dials with a 100 ms base and 3 s max back-off. With gRPC's defaults
    (1 s, up to 120 s) a sync loop that started a moment before the runtime listened failed
    every call for ~5 s after the socket appeared (seen in bench/pods.py)."""
    seen: dict[str, Any] = {}
    real = grpc.insecure_channel

    def spy(target: str, options: Any = None, **kw: Any) -> Any:
        seen.update(options or [])
        return real(target, options=options, **kw)
    monkeypatch.setattr(grpc, "insecure_channel", spy)
    new_runtime_client("unix:///nonexistent/x.sock", timeout=1.0).close()
    assert seen["grpc.initial_reconnect_backoff_ms"] == 100
    assert seen["grpc.min_reconnect_backoff_ms"] == 100
    assert seen["grpc.max_reconnect_backoff_ms"] == 3000


def test_instrumented_counts_calls_errors_and_latency() -> None:
    fake = FakeRuntimeClient()
    ticks = iter(range(100))
    registry = CollectorRegistry()
    client = new_instrumented_client(fake, registry, clock=lambda: float(next(ticks)))
    client.version()
    client.version()
    fake.fail("ContainerStatus", grpc.StatusCode.NOT_FOUND, "nope")
    with pytest.raises(CriError):
        client.container_status("x")

    def value(name: str, labels: dict[str, str]) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("kubelet_runtime_operations_total", {"operation_type": "version"}) == 2
    assert value("kubelet_runtime_operations_total",
                 {"operation_type": "container_status"}) == 1
    assert value("kubelet_runtime_operations_errors_total",
                 {"operation_type": "container_status", "code": "NOT_FOUND"}) == 1
    assert value("kubelet_runtime_operations_duration_seconds_sum",
                 {"operation_type": "version"}) == 2.0
    client.list_pod_sandbox()
    assert value("kubelet_runtime_operations_total", {"operation_type": "list_podsandbox"}) == 1
    assert b"kubelet_runtime_operations_total" in generate_latest(registry)


def test_fake_models_lifecycle_and_records_calls() -> None:
    fake = FakeRuntimeClient()
    events = fake.container_events()
    config = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p", namespace="n", uid="u"))
    sid = fake.run_pod_sandbox(config)
    cid = fake.create_container(sid, pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="c"), image=pb.ImageSpec(image="host")), config)
    fake.start_container(cid)
    assert fake.container_status(cid).state == pb.CONTAINER_RUNNING
    fake.exit_container(cid, 2)
    status = fake.container_status(cid)
    assert (status.state, status.exit_code) == (pb.CONTAINER_EXITED, 2)
    running = pb.ContainerFilter(state=pb.ContainerStateValue(state=pb.CONTAINER_RUNNING))
    assert fake.list_containers(running) == []
    assert [name for name, _ in fake.calls][:3] == [
        "GetContainerEvents", "RunPodSandbox", "CreateContainer"]
    fake.fail("Version", times=1)
    with pytest.raises(CriError):
        fake.version()
    fake.version()  # only once
    fake.close()
    kinds = [e.container_event_type for e in events]
    assert kinds == [pb.CONTAINER_CREATED_EVENT, pb.CONTAINER_STARTED_EVENT,
                     pb.CONTAINER_STOPPED_EVENT]


def test_fake_latency_knob_uses_injected_sleep() -> None:
    slept: list[float] = []
    fake = FakeRuntimeClient(sleep=slept.append)
    fake.latency = 0.25
    fake.version()
    assert slept == [0.25]


def test_cri_api_helper_client_against_embedded(cri_runtime: Any) -> None:
    """A client that nobody here wrote: the PyPI package's own helpers."""
    if cri_runtime.name != "embedded":
        pytest.skip("the helper client is exercised against our own server")
    cid = cri_runtime.start(cri_runtime.run("helper"), "c", ["sleep", "1000"])
    channel = Channel(f"unix://{cri_runtime.embedded.socket}")
    try:
        assert channel.version == "v1"
        containers = Containers(channel)
        listed = containers.list_containers()
        assert [c["id"] for c in listed] == [cid]
        assert containers.get_container(cid)["state"] == "CONTAINER_RUNNING"
        images = Images(channel)
        assert "host" in [tag for i in images.list_images() for tag in i.get("repoTags", [])]
        cri_runtime.client.stop_container(cid, 0)
        containers.remove_container(cid)
        assert containers.list_containers() == []
    finally:
        channel.channel.close()


class _Closing(FakeRuntimeClient):
    closed = False

    def close(self) -> None:
        self.closed = True
        super().close()


def test_on_demand_client_connects_at_first_call_and_lets_go_on_release() -> None:
    made: list[_Closing] = []

    def connect() -> _Closing:
        made.append(_Closing())
        return made[-1]

    client = OnDemandRuntimeClient(connect)
    client.release()  # nothing to let go of
    assert made == [] and not client.connected
    assert client.version().runtime_name
    client.list_images()
    assert len(made) == 1 and client.connected  # one connection for the whole burst
    client.release()
    assert made[0].closed and not client.connected
    client.version()
    assert len(made) == 2 and not made[1].closed
    client.close()
    assert made[1].closed
    with pytest.raises(AttributeError):
        client._private  # noqa: B018 (not a client method: never connects)
    assert len(made) == 2


class _StuckTaskContainerd:
    """A runtime on a real socket that answers as containerd 1.6 does for a container whose
    task outlived its cancelled StartContainer (services/cri/containerd.py): RemoveContainer
    fails with FAILED_PRECONDITION while the task is there; its task API kills, reaps and
    deletes it."""

    def __init__(self) -> None:
        self.task = "created"  # -> "stopped" (Kill) -> "" (Delete)
        self.calls: list[tuple[str, bytes, str]] = []  # (method, request, namespace)

    def handler(self, name: str) -> Any:
        def answer(request: bytes, context: Any) -> bytes:
            namespace = dict(context.invocation_metadata()).get("containerd-namespace", "")
            self.calls.append((name, request, namespace))
            if name == "RemoveContainer":
                if self.task:
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                  'failed to delete containerd container "c1": cannot delete '
                                  "running task c1: failed precondition")
                return b""
            if name == "Kill":
                if self.task != "created":
                    context.abort(grpc.StatusCode.NOT_FOUND, "process already finished")
                self.task = "stopped"
            if name == "Delete":
                if self.task != "stopped":
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, "task must be stopped")
                self.task = ""
            return b""
        return grpc.unary_unary_rpc_method_handler(answer)

    def serve(self, socket: str) -> Any:
        server = grpc.server(ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers([
            grpc.method_handlers_generic_handler("runtime.v1.RuntimeService", {
                "RemoveContainer": self.handler("RemoveContainer")}),
            grpc.method_handlers_generic_handler("containerd.services.tasks.v1.Tasks", {
                name: self.handler(name) for name in ("Kill", "Wait", "Delete")}),
        ])
        server.add_insecure_port(f"unix://{socket}")
        server.start()
        return server


def test_remove_clears_a_task_containerds_cri_cannot_remove(tmp_path: Any) -> None:
    """containerd/containerd#11037: after a StartContainer cancelled by its caller's death the
    container is exited for CRI but its task lives on (a `runc init` in the pod's cgroup), and
    every RemoveContainer fails: the pod could never be removed. The client kills, reaps and
    deletes the task through containerd's task API (namespace k8s.io), then removes the
    container."""
    runtime = _StuckTaskContainerd()
    server = runtime.serve(str(tmp_path / "c.sock"))
    client = new_runtime_client(f"unix://{tmp_path}/c.sock", timeout=10.0)
    try:
        client.remove_container("c1")
        assert runtime.task == ""
        assert [(m, ns) for m, _, ns in runtime.calls] == [
            ("RemoveContainer", ""), ("Kill", "k8s.io"), ("Wait", "k8s.io"),
            ("Delete", "k8s.io"), ("RemoveContainer", "")]
        assert runtime.calls[1][1] == kill_request("c1") == b"\x0a\x02c1\x18\x09"
        assert runtime.calls[2][1] == runtime.calls[3][1] == b"\x0a\x02c1"
        runtime.calls.clear()
        client.remove_container("c1")  # an ordinary removal: no task call
        assert [m for m, _, _ in runtime.calls] == ["RemoveContainer"]
    finally:
        client.close()
        server.stop(None)
