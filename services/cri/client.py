"""``RuntimeClient``: the one narrow CRI interface every podvisor subsystem uses.

Conventions (the same for every implementation: the gRPC client, the instrumented wrapper and
the fake):

- Return values are the runtime.v1 protobuf messages from ``cri_api.v1.api_pb2`` (``pb``): the
  response's payload (``pb.ContainerStatus``, a ``list[pb.Container]``, an ID ``str``), or the
  whole response when it has several fields (``version``, ``status``, ``exec_sync``,
  ``image_fs_info``). Nothing else leaks gRPC types.
- Every failure raises ``CriError`` (``.code`` is a ``grpc.StatusCode``; ``.not_found``).
- Every unary call has a deadline: the client's ``timeout``; ``stop_container`` adds the stop
  grace, ``exec_sync`` adds the exec timeout, ``pull_image`` uses ``pull_timeout``.
- ``container_events()`` is the only stream; it has no deadline and ends on ``close()``.
- Thread-safety: implementations are safe to call from several threads at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from cri_api.v1 import api_pb2 as pb


class EventStream(Protocol):
    """A live GetContainerEvents stream. Iterate to receive events; ``close()`` ends it.

    Iteration stops cleanly after ``close()``; any other failure raises ``CriError`` (containerd
    1.6 answers UNIMPLEMENTED: fall back to relisting).
    """

    def __iter__(self) -> Iterator[pb.ContainerEventResponse]: ...

    def wait_subscribed(self) -> None:
        """Block until the runtime has taken the subscription (its response headers arrived),
        so every event from now on will be delivered: a consumer relists after this, never
        before. Raises ``CriError`` as iteration does; returns at once after ``close()``."""

    def close(self) -> None: ...


class RuntimeClient(Protocol):
    """runtime.v1 RuntimeService + ImageService, narrowed to what podvisor uses."""

    # --- runtime ---
    def version(self) -> pb.VersionResponse: ...

    def status(self, verbose: bool = False) -> pb.StatusResponse: ...

    # --- sandboxes ---
    def run_pod_sandbox(self, config: pb.PodSandboxConfig, runtime_handler: str = "") -> str: ...

    def stop_pod_sandbox(self, sandbox_id: str) -> None: ...

    def remove_pod_sandbox(self, sandbox_id: str) -> None: ...

    def pod_sandbox_status(self, sandbox_id: str) -> pb.PodSandboxStatus: ...

    def list_pod_sandbox(self, filter: pb.PodSandboxFilter | None = None) -> list[pb.PodSandbox]:
        ...

    # --- containers ---
    def create_container(
        self, sandbox_id: str, config: pb.ContainerConfig, sandbox_config: pb.PodSandboxConfig
    ) -> str: ...

    def start_container(self, container_id: str) -> None: ...

    def stop_container(self, container_id: str, timeout: int) -> None:
        """TERM, then KILL after ``timeout`` seconds (0 = KILL at once)."""

    def remove_container(self, container_id: str) -> None: ...

    def list_containers(self, filter: pb.ContainerFilter | None = None) -> list[pb.Container]: ...

    def container_status(self, container_id: str) -> pb.ContainerStatus: ...

    def exec_sync(
        self, container_id: str, cmd: Sequence[str], timeout: float
    ) -> pb.ExecSyncResponse:
        """Run ``cmd`` in the container; ``timeout`` seconds (0 = none; rounded up to 1 s)."""

    def exec(self, request: pb.ExecRequest) -> str:
        """CRI ``Exec``: the streaming server's URL (single use) for the request."""

    def attach(self, request: pb.AttachRequest) -> str:
        """CRI ``Attach``: the streaming server's URL (single use) for the request."""

    def port_forward(self, request: pb.PortForwardRequest) -> str:
        """CRI ``PortForward``: the streaming server's URL (single use) for the request."""

    def reopen_container_log(self, container_id: str) -> None: ...

    def container_stats(self, container_id: str) -> pb.ContainerStats: ...

    def list_container_stats(
        self, filter: pb.ContainerStatsFilter | None = None
    ) -> list[pb.ContainerStats]: ...

    def update_container_resources(
        self, container_id: str, linux: pb.LinuxContainerResources
    ) -> None: ...

    def container_events(self) -> EventStream: ...

    # --- images ---
    def list_images(self, filter: pb.ImageFilter | None = None) -> list[pb.Image]: ...

    def image_status(self, image: str) -> pb.Image | None:
        """The image, or None when the runtime does not have it."""

    def pull_image(
        self,
        image: str,
        sandbox_config: pb.PodSandboxConfig | None = None,
        annotations: Mapping[str, str] | None = None,
        auth: pb.AuthConfig | None = None,
    ) -> str:
        """Pull ``image``; returns the image reference (ID) the runtime knows it by."""

    def remove_image(self, image: str) -> None: ...

    def image_fs_info(self) -> pb.ImageFsInfoResponse: ...

    def close(self) -> None: ...
