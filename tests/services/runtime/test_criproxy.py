"""The CRI proxy (services/runtime/criproxy.py, issue 28: cri faults on a remote runtime), in
front of a real runtime (the embedded one, served on this process's threads): what goes
through comes back as the runtime said it (answers, status codes and their details, the event
stream), and the cri faults set on the proxy apply there, on the chosen methods only, until
cleared. The same against containerd with a whole node: test_e2e_cri_faults.py."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb
from cri_api.v1 import api_pb2_grpc as pb_grpc

from podvisor.common.logs import MemoryLogger
from podvisor.ipc.faults import ActiveFault, FaultSpec
from podvisor.services.cri import CriError, new_runtime_client
from podvisor.services.runtime import serve_in_process
from podvisor.services.runtime.criproxy import CriProxy
from tests.services.conftest import RuntimeUnderTest, short_tmp


@dataclass
class Pair:
    direct: Any  # a RuntimeClient on the runtime itself
    proxied: Any  # one on the proxy
    proxy: CriProxy
    target: str  # the proxy's gRPC target
    base: Path  # a short temp dir


@pytest.fixture
def pair() -> Iterator[Pair]:
    base = short_tmp("pvpx")
    upstream, socket = base / "rt.sock", base / "proxy.sock"
    try:
        with serve_in_process(base / "runtime", upstream, MemoryLogger()):
            proxy = CriProxy(f"unix://{upstream}", socket, MemoryLogger())
            proxy.start()
            direct = new_runtime_client(f"unix://{upstream}", timeout=30.0)
            proxied = new_runtime_client(f"unix://{socket}", timeout=30.0)
            try:
                yield Pair(direct, proxied, proxy, f"unix://{socket}", base)
            finally:
                direct.close()
                proxied.close()
                proxy.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _set(proxy: CriProxy, *specs: FaultSpec) -> None:
    proxy.faults.set([ActiveFault(f"f{i}", spec, 0.0) for i, spec in enumerate(specs, 1)])


def test_answers_and_errors_pass_through_unchanged(pair: Pair) -> None:
    assert pair.proxied.version() == pair.direct.version()
    assert pair.proxied.status() == pair.direct.status()
    assert pair.proxied.list_images() == pair.direct.list_images()  # the image service too
    assert pair.proxied.list_pod_sandbox() == pair.direct.list_pod_sandbox()
    with pytest.raises(CriError) as direct:
        pair.direct.container_status("nosuch")
    with pytest.raises(CriError) as proxied:
        pair.proxied.container_status("nosuch")
    assert (proxied.value.code, proxied.value.message) == (direct.value.code,
                                                           direct.value.message)
    assert proxied.value.not_found


def test_the_event_stream_is_forwarded_and_ends_with_its_client(pair: Pair) -> None:
    channel = grpc.insecure_channel(pair.target)
    try:
        stream = pb_grpc.RuntimeServiceStub(channel).GetContainerEvents(pb.GetEventsRequest())
        got: list[Any] = []
        ended: list[grpc.StatusCode] = []

        def read() -> None:
            try:
                got.extend(stream)
            except grpc.RpcError as err:
                ended.append(err.code())
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        # a container made through the proxy (not started: no process): its event comes back
        under = RuntimeUnderTest("embedded", pair.proxied, "host", pair.base)
        sid, config = under.run("px")
        try:
            cid = pair.proxied.create_container(sid, under.container_config("c", ["true"]),
                                                config)
            deadline = time.monotonic() + 30
            while not got and time.monotonic() < deadline and reader.is_alive():
                reader.join(0.05)
            assert got and got[0].container_id == cid, got
            assert got[0].container_event_type == pb.CONTAINER_CREATED_EVENT
        finally:
            pair.proxied.stop_pod_sandbox(sid)
            pair.proxied.remove_pod_sandbox(sid)
        stream.cancel()
        reader.join(10)
        assert not reader.is_alive() and ended == [grpc.StatusCode.CANCELLED]
    finally:
        channel.close()


def test_cri_faults_apply_at_the_proxy_on_the_chosen_methods_until_cleared(pair: Pair) -> None:
    _set(pair.proxy, FaultSpec("cri", "runtime", action="latency", delay=1.0,
                               methods=("ListPodSandbox",)),
         FaultSpec("cri", "runtime", action="error", code="RESOURCE_EXHAUSTED",
                   methods=("ListImages",)))
    t0 = time.monotonic()
    pair.proxied.list_pod_sandbox()
    assert time.monotonic() - t0 >= 1.0  # the latency is injected, not measured
    with pytest.raises(CriError) as err:
        pair.proxied.list_images()
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "injected fault f2" in err.value.message
    assert pair.proxied.version().runtime_name  # the others answer
    assert pair.direct.list_images() is not None  # the runtime itself never saw a fault
    _set(pair.proxy, FaultSpec("cri", "runtime", action="hang", methods=("Version",)))
    quick = new_runtime_client(pair.target, timeout=1.0)
    try:
        with pytest.raises(CriError) as hung:
            quick.version()
        assert hung.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        _set(pair.proxy)  # cleared
        assert quick.version().runtime_name
        assert pair.proxied.list_images() is not None
    finally:
        quick.close()
