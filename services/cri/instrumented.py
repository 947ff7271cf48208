"""A RuntimeClient wrapper that counts calls and errors and times them, per CRI method, under
the kubelet's names (registered on the registry passed in, never the global one; in the agent
prometheus-client's multiprocess mode writes them to ``<rootDir>/run/metrics``, which the main
port's ``/metrics`` sums):
  kubelet_runtime_operations_total{operation_type}             every call, failed or not
  kubelet_runtime_operations_errors_total{operation_type,code} calls that raised CriError
                                                               (code = gRPC code, podvisor's)
  kubelet_runtime_operations_duration_seconds{operation_type}  latency histogram
``operation_type`` is the kubelet's spelling of the CRI method (``RunPodSandbox`` ->
``run_podsandbox``, ``ContainerStatus`` -> ``container_status``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

from cri_api.v1 import api_pb2 as pb
from prometheus_client import CollectorRegistry, Counter, Histogram

from podvisor.common.buckets import exponential_buckets
from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.services.cri.client import EventStream, RuntimeClient
from podvisor.services.cri.errors import CriError

R = TypeVar("R")

_BUCKETS = exponential_buckets(0.005, 2.5, 14)  # the kubelet's, for runtime operations


def operation_type(method: str) -> str:
    """The kubelet's ``operation_type`` of a CRI method name."""
    words = re.sub(r"(?<!^)(?=[A-Z])", "_", method.replace("PodSandbox", "Podsandbox"))
    return words.lower()


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "kubelet_runtime_operations", "Cumulative number of runtime operations by "
            "operation type.", ["operation_type"], registry=registry)
        self.errors = Counter(
            "kubelet_runtime_operations_errors", "Cumulative number of runtime operation "
            "errors by operation type (and gRPC code).", ["operation_type", "code"],
            registry=registry)
        self.latency = Histogram(
            "kubelet_runtime_operations_duration_seconds", "Duration in seconds of runtime "
            "operations. Broken down by operation type.", ["operation_type"],
            buckets=_BUCKETS, registry=registry)


class _CountingStream:
    def __init__(self, inner: EventStream, metrics: _Metrics) -> None:
        self._inner = inner
        self._metrics = metrics

    def __iter__(self) -> Iterator[pb.ContainerEventResponse]:
        try:
            yield from self._inner
        except CriError as err:
            self._metrics.errors.labels("get_container_events", err.code.name).inc()
            raise

    def wait_subscribed(self) -> None:
        try:
            self._inner.wait_subscribed()
        except CriError as err:
            self._metrics.errors.labels("get_container_events", err.code.name).inc()
            raise

    def close(self) -> None:
        self._inner.close()


class _InstrumentedRuntimeClient:
    def __init__(
        self, inner: RuntimeClient, metrics: _Metrics, clock: Callable[[], float]
    ) -> None:
        self._inner = inner
        self._m = metrics
        self._clock = clock

    def _observe(self, method: str, fn: Callable[[], R]) -> R:
        op = operation_type(method)
        self._m.calls.labels(op).inc()
        start = self._clock()
        try:
            return fn()
        except CriError as err:
            self._m.errors.labels(op, err.code.name).inc()
            raise
        finally:
            self._m.latency.labels(op).observe(self._clock() - start)

    def version(self) -> pb.VersionResponse:
        return self._observe("Version", self._inner.version)

    def status(self, verbose: bool = False) -> pb.StatusResponse:
        return self._observe("Status", lambda: self._inner.status(verbose))

    def run_pod_sandbox(self, config: pb.PodSandboxConfig, runtime_handler: str = "") -> str:
        return self._observe(
            "RunPodSandbox", lambda: self._inner.run_pod_sandbox(config, runtime_handler)
        )

    def stop_pod_sandbox(self, sandbox_id: str) -> None:
        self._observe("StopPodSandbox", lambda: self._inner.stop_pod_sandbox(sandbox_id))

    def remove_pod_sandbox(self, sandbox_id: str) -> None:
        self._observe("RemovePodSandbox", lambda: self._inner.remove_pod_sandbox(sandbox_id))

    def pod_sandbox_status(self, sandbox_id: str) -> pb.PodSandboxStatus:
        return self._observe(
            "PodSandboxStatus", lambda: self._inner.pod_sandbox_status(sandbox_id)
        )

    def list_pod_sandbox(self, filter: pb.PodSandboxFilter | None = None) -> list[pb.PodSandbox]:
        return self._observe("ListPodSandbox", lambda: self._inner.list_pod_sandbox(filter))

    def create_container(
        self, sandbox_id: str, config: pb.ContainerConfig, sandbox_config: pb.PodSandboxConfig
    ) -> str:
        return self._observe(
            "CreateContainer",
            lambda: self._inner.create_container(sandbox_id, config, sandbox_config),
        )

    def start_container(self, container_id: str) -> None:
        self._observe("StartContainer", lambda: self._inner.start_container(container_id))

    def stop_container(self, container_id: str, timeout: int) -> None:
        self._observe(
            "StopContainer", lambda: self._inner.stop_container(container_id, timeout)
        )

    def remove_container(self, container_id: str) -> None:
        self._observe("RemoveContainer", lambda: self._inner.remove_container(container_id))

    def list_containers(self, filter: pb.ContainerFilter | None = None) -> list[pb.Container]:
        return self._observe("ListContainers", lambda: self._inner.list_containers(filter))

    def container_status(self, container_id: str) -> pb.ContainerStatus:
        return self._observe(
            "ContainerStatus", lambda: self._inner.container_status(container_id)
        )

    def exec_sync(
        self, container_id: str, cmd: Sequence[str], timeout: float
    ) -> pb.ExecSyncResponse:
        return self._observe(
            "ExecSync", lambda: self._inner.exec_sync(container_id, cmd, timeout)
        )

    def exec(self, request: pb.ExecRequest) -> str:
        return self._observe("Exec", lambda: self._inner.exec(request))

    def attach(self, request: pb.AttachRequest) -> str:
        return self._observe("Attach", lambda: self._inner.attach(request))

    def port_forward(self, request: pb.PortForwardRequest) -> str:
        return self._observe("PortForward", lambda: self._inner.port_forward(request))

    def reopen_container_log(self, container_id: str) -> None:
        self._observe(
            "ReopenContainerLog", lambda: self._inner.reopen_container_log(container_id)
        )

    def container_stats(self, container_id: str) -> pb.ContainerStats:
        return self._observe("ContainerStats", lambda: self._inner.container_stats(container_id))

    def list_container_stats(
        self, filter: pb.ContainerStatsFilter | None = None
    ) -> list[pb.ContainerStats]:
        return self._observe(
            "ListContainerStats", lambda: self._inner.list_container_stats(filter)
        )

    def update_container_resources(
        self, container_id: str, linux: pb.LinuxContainerResources
    ) -> None:
        self._observe(
            "UpdateContainerResources",
            lambda: self._inner.update_container_resources(container_id, linux),
        )

    def container_events(self) -> EventStream:
        inner = self._observe("GetContainerEvents", self._inner.container_events)
        return _CountingStream(inner, self._m)

    def list_images(self, filter: pb.ImageFilter | None = None) -> list[pb.Image]:
        return self._observe("ListImages", lambda: self._inner.list_images(filter))

    def image_status(self, image: str) -> pb.Image | None:
        return self._observe("ImageStatus", lambda: self._inner.image_status(image))

    def pull_image(
        self,
        image: str,
        sandbox_config: pb.PodSandboxConfig | None = None,
        annotations: Mapping[str, str] | None = None,
        auth: pb.AuthConfig | None = None,
    ) -> str:
        return self._observe(
            "PullImage", lambda: self._inner.pull_image(image, sandbox_config, annotations, auth)
        )

    def remove_image(self, image: str) -> None:
        self._observe("RemoveImage", lambda: self._inner.remove_image(image))

    def image_fs_info(self) -> pb.ImageFsInfoResponse:
        return self._observe("ImageFsInfo", self._inner.image_fs_info)

    def close(self) -> None:
        self._inner.close()


def new_instrumented_client(
    inner: RuntimeClient,
    registry: CollectorRegistry,
    clock: Callable[[], float] = SYSTEM_CLOCK.monotonic,
) -> RuntimeClient:
    """Wrap ``inner``; metrics go to ``registry``. One wrapper per registry (names are fixed)."""
    return _InstrumentedRuntimeClient(inner, _Metrics(registry), clock)
