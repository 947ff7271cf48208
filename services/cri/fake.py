"""FakeRuntimeClient: an in-memory RuntimeClient for unit tests (never for integration tests).

It records every call in ``calls`` as ``(method, args)`` and has knobs:
  - ``fail(method, code, message, times=None)``: raise CriError from ``method`` (``times`` calls,
    or forever); ``clear_failures()``.
  - ``latency``: seconds added to every call through the injected ``sleep`` (default no-op).
  - ``exit_container(id, exit_code)``: make a running container exit, as if its process died.
  - ``set_network(ready, reason, message)``: the NetworkReady condition of ``status``. While it
    is not ready the fake behaves as containerd 1.6 without a CNI config: RunPodSandbox of a
    sandbox with its own network (``NamespaceMode.POD``) fails "cni plugin not initialized" but
    leaves a NOTREADY sandbox (no creation time) that holds its name (name, uid, namespace,
    attempt) until it is removed: a later RunPodSandbox with that name fails "is reserved", and
    StopPodSandbox of it fails until the network is ready. Sandboxes with their own network
    that did start report an IP from 10.88.0.0/16.
It models sandboxes, containers and the ``host`` image just enough for PLEG/syncloop logic;
methods are guarded by one lock, so it is thread-safe.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import grpc
from cri_api.v1 import api_pb2 as pb

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.services.cri.errors import CriError

HOST_IMAGE = "host"
_DONE = object()


class FakeEventStream:
    def __init__(self) -> None:
        self.queue: queue.Queue[Any] = queue.Queue()
        self.subscribed = threading.Event()  # cleared: wait_subscribed blocks (tests)
        self.subscribed.set()

    def __iter__(self) -> Iterator[pb.ContainerEventResponse]:
        while (item := self.queue.get()) is not _DONE:
            yield item

    def wait_subscribed(self) -> None:
        """Subscribed at creation (``container_events`` registers it), unless a test holds
        ``subscribed`` cleared (``FakeRuntimeClient.hold_subscriptions``)."""
        self.subscribed.wait()

    def close(self) -> None:
        self.queue.put(_DONE)
        self.subscribed.set()


class FakeRuntimeClient:
    def __init__(
        self,
        clock: Callable[[], int] = SYSTEM_CLOCK.wall_ns,
        sleep: Callable[[float], None] = lambda _s: None,
    ) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.latency = 0.0
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.RLock()
        self._failures: dict[str, tuple[grpc.StatusCode, str, int | None]] = {}
        self._ids = itertools.count(1)
        self.sandboxes: dict[str, pb.PodSandboxStatus] = {}
        self.containers: dict[str, tuple[str, pb.ContainerStatus]] = {}  # id -> (sandbox, status)
        self.images: dict[str, pb.Image] = {HOST_IMAGE: pb.Image(id=HOST_IMAGE,
                                                                  repo_tags=[HOST_IMAGE])}
        self.streams: list[FakeEventStream] = []
        self.hold_subscriptions = False  # new streams' wait_subscribed blocks until released
        self.exec_results: dict[str, pb.ExecSyncResponse] = {}
        self.unpullable: set[str] = set()  # images whose pull fails NOT_FOUND (no such image)
        self.network = pb.RuntimeCondition(type="NetworkReady", status=True)
        # Status's runtime_handlers (name -> recursive read-only mounts); RunPodSandbox refuses
        # a handler not listed, as a runtime not configured for it (empty: any handler)
        self.runtime_handlers: dict[str, bool] = {}
        self._reserved: dict[str, str] = {}  # sandbox name -> the sandbox holding it
        self._no_network: set[str] = set()  # sandboxes whose network setup failed
        self._ips = itertools.count(2)

    # --- knobs ---
    def fail(self, method: str, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
             message: str = "injected failure", times: int | None = None) -> None:
        with self._lock:
            self._failures[method] = (code, message, times)

    def clear_failures(self) -> None:
        with self._lock:
            self._failures.clear()

    def exit_container(self, container_id: str, exit_code: int, reason: str = "Error") -> None:
        with self._lock:
            status = self._container(container_id)
            status.state = pb.CONTAINER_EXITED
            status.exit_code = exit_code
            status.reason = "Completed" if exit_code == 0 else reason
            status.finished_at = self._clock()
            self._emit(container_id, pb.CONTAINER_STOPPED_EVENT)

    def set_network(self, ready: bool, reason: str = "NetworkPluginNotReady",
                    message: str = "Network plugin returns error: cni plugin not initialized"
                    ) -> None:
        with self._lock:
            self.network = pb.RuntimeCondition(type="NetworkReady", status=ready,
                                               reason="" if ready else reason,
                                               message="" if ready else message)

    def method_calls(self, method: str) -> list[tuple[Any, ...]]:
        with self._lock:
            return [args for name, args in self.calls if name == method]

    # --- plumbing ---
    def _enter(self, method: str, *args: Any) -> None:
        with self._lock:
            self.calls.append((method, args))
            failure = self._failures.get(method)
            if failure is not None:
                code, message, times = failure
                if times is not None:
                    if times <= 1:
                        del self._failures[method]
                    else:
                        self._failures[method] = (code, message, times - 1)
                raise CriError(method, code, message)
        if self.latency:
            self._sleep(self.latency)

    def _container(self, container_id: str) -> pb.ContainerStatus:
        if container_id not in self.containers:
            raise CriError("fake", grpc.StatusCode.NOT_FOUND,
                           f"container {container_id!r} not found")
        return self.containers[container_id][1]

    def _sandbox(self, sandbox_id: str) -> pb.PodSandboxStatus:
        if sandbox_id not in self.sandboxes:
            raise CriError("fake", grpc.StatusCode.NOT_FOUND, f"sandbox {sandbox_id!r} not found")
        return self.sandboxes[sandbox_id]

    def _emit(self, container_id: str, kind: int, sandbox_id: str = "") -> None:
        """As the embedded runtime: the sandbox's status and every container of it, the
        event's own first (absent after a removal)."""
        if container_id in self.containers:
            sandbox_id = self.containers[container_id][0]
        gone = kind == pb.CONTAINER_DELETED_EVENT
        statuses = sorted((st for sb, st in self.containers.values()
                           if sb == sandbox_id and not (gone and st.id == container_id)),
                          key=lambda st: st.id != container_id)
        event = pb.ContainerEventResponse(
            container_id=container_id, container_event_type=kind,  # type: ignore[arg-type]
            created_at=self._clock(), containers_statuses=statuses,
            pod_sandbox_status=self.sandboxes.get(sandbox_id),
        )
        for stream in self.streams:
            stream.queue.put(event)

    # --- runtime ---
    def version(self) -> pb.VersionResponse:
        self._enter("Version")
        return pb.VersionResponse(version="0.1.0", runtime_name="fake",
                                  runtime_version="0.1.0", runtime_api_version="v1")

    def status(self, verbose: bool = False) -> pb.StatusResponse:
        self._enter("Status", verbose)
        with self._lock:
            conds = [pb.RuntimeCondition(type="RuntimeReady", status=True), self.network]
            handlers = [pb.RuntimeHandler(name=n, features=pb.RuntimeHandlerFeatures(
                recursive_read_only_mounts=rro)) for n, rro in self.runtime_handlers.items()]
        return pb.StatusResponse(status=pb.RuntimeStatus(conditions=conds),
                                 runtime_handlers=handlers)

    # --- sandboxes ---
    def run_pod_sandbox(self, config: pb.PodSandboxConfig, runtime_handler: str = "") -> str:
        self._enter("RunPodSandbox", config, runtime_handler)
        with self._lock:
            m = config.metadata
            name = f"{m.name}_{m.namespace}_{m.uid}_{m.attempt}"
            if self.runtime_handlers and runtime_handler not in self.runtime_handlers:
                raise CriError("RunPodSandbox", grpc.StatusCode.NOT_FOUND,
                               f'no runtime for "{runtime_handler}" is configured')
            if name in self._reserved:
                raise CriError("RunPodSandbox", grpc.StatusCode.UNKNOWN,
                               f'failed to reserve sandbox name "{name}": name "{name}" is '
                               f'reserved for "{self._reserved[name]}"')
            sid = f"sandbox-{next(self._ids)}"
            own = config.linux.security_context.namespace_options.network == pb.POD
            self.sandboxes[sid] = pb.PodSandboxStatus(
                id=sid, metadata=config.metadata, state=pb.SANDBOX_READY,
                created_at=self._clock(), labels=config.labels, annotations=config.annotations,
            )
            if own and not self.network.status:
                self._reserved[name] = sid  # (containerd reserves every name; the fake only
                self._no_network.add(sid)   # these, so tests may reuse names otherwise)
                self.sandboxes[sid].state = pb.SANDBOX_NOTREADY
                self.sandboxes[sid].created_at = 0
                raise CriError("RunPodSandbox", grpc.StatusCode.UNKNOWN,
                               f'failed to setup network for sandbox "{sid}": cni plugin not '
                               f'initialized')
            if own:
                n = next(self._ips)
                self.sandboxes[sid].network.ip = f"10.88.{n // 250}.{n % 250 + 2}"
            return sid

    def stop_pod_sandbox(self, sandbox_id: str) -> None:
        self._enter("StopPodSandbox", sandbox_id)
        with self._lock:
            if sandbox_id in self._no_network and not self.network.status:
                raise CriError("StopPodSandbox", grpc.StatusCode.UNKNOWN,
                               f'failed to destroy network for sandbox "{sandbox_id}": cni '
                               f'plugin not initialized')
            self._no_network.discard(sandbox_id)
            self._sandbox(sandbox_id).state = pb.SANDBOX_NOTREADY
            for cid, (sid, status) in list(self.containers.items()):
                if sid == sandbox_id and status.state == pb.CONTAINER_RUNNING:
                    self.exit_container(cid, 137)

    def remove_pod_sandbox(self, sandbox_id: str) -> None:
        self._enter("RemovePodSandbox", sandbox_id)
        with self._lock:
            self.sandboxes.pop(sandbox_id, None)
            self._reserved = {k: v for k, v in self._reserved.items() if v != sandbox_id}
            for cid, (sid, _status) in list(self.containers.items()):
                if sid == sandbox_id:
                    self._emit(cid, pb.CONTAINER_DELETED_EVENT)
                    del self.containers[cid]

    def pod_sandbox_status(self, sandbox_id: str) -> pb.PodSandboxStatus:
        self._enter("PodSandboxStatus", sandbox_id)
        with self._lock:
            out = pb.PodSandboxStatus()
            out.CopyFrom(self._sandbox(sandbox_id))
            return out

    def list_pod_sandbox(self, filter: pb.PodSandboxFilter | None = None) -> list[pb.PodSandbox]:
        self._enter("ListPodSandbox", filter)
        with self._lock:
            out = [pb.PodSandbox(id=s.id, metadata=s.metadata, state=s.state,
                                 created_at=s.created_at, labels=s.labels,
                                 annotations=s.annotations) for s in self.sandboxes.values()]
        if filter is not None:
            out = [s for s in out if (not filter.id or s.id == filter.id)
                   and (not filter.HasField("state") or s.state == filter.state.state)
                   and all(s.labels.get(k) == v for k, v in filter.label_selector.items())]
        return out

    # --- containers ---
    def create_container(
        self, sandbox_id: str, config: pb.ContainerConfig, sandbox_config: pb.PodSandboxConfig
    ) -> str:
        self._enter("CreateContainer", sandbox_id, config, sandbox_config)
        with self._lock:
            self._sandbox(sandbox_id)
            cid = f"container-{next(self._ids)}"
            self.containers[cid] = (sandbox_id, pb.ContainerStatus(
                id=cid, metadata=config.metadata, state=pb.CONTAINER_CREATED,
                created_at=self._clock(), image=config.image, image_ref=config.image.image,
                labels=config.labels, annotations=config.annotations, log_path=config.log_path,
            ))
            self._emit(cid, pb.CONTAINER_CREATED_EVENT)
            return cid

    def start_container(self, container_id: str) -> None:
        self._enter("StartContainer", container_id)
        with self._lock:
            status = self._container(container_id)
            if status.state != pb.CONTAINER_CREATED:
                raise CriError("StartContainer", grpc.StatusCode.FAILED_PRECONDITION,
                               f"container {container_id} is not in created state")
            status.state = pb.CONTAINER_RUNNING
            status.started_at = self._clock()
            self._emit(container_id, pb.CONTAINER_STARTED_EVENT)

    def stop_container(self, container_id: str, timeout: int) -> None:
        self._enter("StopContainer", container_id, timeout)
        with self._lock:
            if self._container(container_id).state == pb.CONTAINER_RUNNING:
                self.exit_container(container_id, 143 if timeout > 0 else 137)

    def remove_container(self, container_id: str) -> None:
        self._enter("RemoveContainer", container_id)
        with self._lock:
            if container_id in self.containers:
                self._emit(container_id, pb.CONTAINER_DELETED_EVENT)
                del self.containers[container_id]

    def list_containers(self, filter: pb.ContainerFilter | None = None) -> list[pb.Container]:
        self._enter("ListContainers", filter)
        with self._lock:
            out = [pb.Container(id=c.id, pod_sandbox_id=sid, metadata=c.metadata, image=c.image,
                                image_ref=c.image_ref, state=c.state, created_at=c.created_at,
                                labels=c.labels, annotations=c.annotations)
                   for sid, c in self.containers.values()]
        if filter is not None:
            out = [c for c in out if (not filter.id or c.id == filter.id)
                   and (not filter.pod_sandbox_id or c.pod_sandbox_id == filter.pod_sandbox_id)
                   and (not filter.HasField("state") or c.state == filter.state.state)
                   and all(c.labels.get(k) == v for k, v in filter.label_selector.items())]
        return out

    def container_status(self, container_id: str) -> pb.ContainerStatus:
        self._enter("ContainerStatus", container_id)
        with self._lock:
            out = pb.ContainerStatus()
            out.CopyFrom(self._container(container_id))
            return out

    def exec_sync(
        self, container_id: str, cmd: Sequence[str], timeout: float
    ) -> pb.ExecSyncResponse:
        self._enter("ExecSync", container_id, tuple(cmd), timeout)
        with self._lock:
            if self._container(container_id).state != pb.CONTAINER_RUNNING:
                raise CriError("ExecSync", grpc.StatusCode.FAILED_PRECONDITION,
                               f"container {container_id} is not running")
            return self.exec_results.get(container_id, pb.ExecSyncResponse(exit_code=0))

    def exec(self, request: pb.ExecRequest) -> str:
        self._enter("Exec", request.container_id, tuple(request.cmd))
        raise CriError("Exec", grpc.StatusCode.UNIMPLEMENTED, "the fake runtime does not stream")

    def attach(self, request: pb.AttachRequest) -> str:
        self._enter("Attach", request.container_id)
        raise CriError("Attach", grpc.StatusCode.UNIMPLEMENTED,
                       "the fake runtime does not stream")

    def port_forward(self, request: pb.PortForwardRequest) -> str:
        self._enter("PortForward", request.pod_sandbox_id)
        raise CriError("PortForward", grpc.StatusCode.UNIMPLEMENTED,
                       "the fake runtime does not stream")

    def reopen_container_log(self, container_id: str) -> None:
        self._enter("ReopenContainerLog", container_id)
        with self._lock:
            self._container(container_id)

    def container_stats(self, container_id: str) -> pb.ContainerStats:
        self._enter("ContainerStats", container_id)
        with self._lock:
            c = self._container(container_id)
            attrs = pb.ContainerAttributes(id=c.id, metadata=c.metadata)
            return pb.ContainerStats(attributes=attrs)

    def list_container_stats(
        self, filter: pb.ContainerStatsFilter | None = None
    ) -> list[pb.ContainerStats]:
        self._enter("ListContainerStats", filter)
        with self._lock:
            return [pb.ContainerStats(attributes=pb.ContainerAttributes(id=c.id))
                    for _sid, c in self.containers.values()]

    def update_container_resources(
        self, container_id: str, linux: pb.LinuxContainerResources
    ) -> None:
        self._enter("UpdateContainerResources", container_id, linux)
        with self._lock:
            self._container(container_id)

    def container_events(self) -> FakeEventStream:
        self._enter("GetContainerEvents")
        stream = FakeEventStream()
        if self.hold_subscriptions:
            stream.subscribed.clear()
        with self._lock:
            self.streams.append(stream)
        return stream

    # --- images ---
    def list_images(self, filter: pb.ImageFilter | None = None) -> list[pb.Image]:
        self._enter("ListImages", filter)
        with self._lock:
            return list(self.images.values())

    def image_status(self, image: str) -> pb.Image | None:
        self._enter("ImageStatus", image)
        with self._lock:
            return self.images.get(image)

    def pull_image(
        self,
        image: str,
        sandbox_config: pb.PodSandboxConfig | None = None,
        annotations: Mapping[str, str] | None = None,
        auth: pb.AuthConfig | None = None,
    ) -> str:
        self._enter("PullImage", image, sandbox_config, annotations)
        with self._lock:
            if image in self.unpullable:
                raise CriError("PullImage", grpc.StatusCode.NOT_FOUND,
                               f"failed to pull {image!r}: not found")
            self.images.setdefault(image, pb.Image(id=image, repo_tags=[image]))
            return image

    def remove_image(self, image: str) -> None:
        self._enter("RemoveImage", image)
        with self._lock:
            self.images.pop(image, None)

    def image_fs_info(self) -> pb.ImageFsInfoResponse:
        self._enter("ImageFsInfo")
        usage = pb.FilesystemUsage(timestamp=self._clock(),
                                   fs_id=pb.FilesystemIdentifier(mountpoint="/fake/images"))
        return pb.ImageFsInfoResponse(image_filesystems=[usage])

    def close(self) -> None:
        with self._lock:
            for stream in self.streams:
                stream.close()


def new_fake_runtime_client() -> FakeRuntimeClient:
    return FakeRuntimeClient()
