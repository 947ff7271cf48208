"""runtime.v1 RuntimeService and ImageService over the Engine.

Every handler runs inside ``_guard``: a Fault becomes its gRPC status; anything unexpected is
logged and answered with INTERNAL, so bad input never takes the server down. Methods not defined
here fall through to the generated base class, which answers UNIMPLEMENTED.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import grpc
from cri_api.v1 import api_pb2 as pb
from cri_api.v1 import api_pb2_grpc as pb_grpc

from podvisor.services.runtime import convert, execsync
from podvisor.services.runtime.engine import Engine
from podvisor.services.runtime.faults import Fault, precondition
from podvisor.services.runtime.index import POD_UID_LABEL
from podvisor.services.runtime.model import (
    Container,
    ContainerState,
    Sandbox,
    SandboxState,
    labels_match,
)
from podvisor.services.runtime.stats import StatsCollector
from podvisor.services.runtime.streaming import (
    AttachRequest,
    ExecRequest,
    PortForwardRequest,
    StreamingServer,
)

VERSION = "0.1.0"
RUNTIME_NAME = "podvisor-embedded"
F = TypeVar("F", bound=Callable[..., Any])


def _guard(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except Fault as fault:
            context.abort(fault.code, fault.message)
        except Exception as err:
            self.engine.log.error("cri.internal_error", method=fn.__name__, error=repr(err))
            context.abort(grpc.StatusCode.INTERNAL, f"{fn.__name__}: {err!r}")
    return wrapper  # type: ignore[return-value]


def _prefix(value: str, want: str) -> bool:
    return not want or value.startswith(want)


def _filter_sandboxes(items: list[Sandbox], f: pb.PodSandboxFilter) -> list[Sandbox]:
    return [s for s in items if _prefix(s.id, f.id)
            and (not f.HasField("state") or s.state.to_pb() == f.state.state)
            and labels_match(s.config.labels, f.label_selector)]


def _filter_containers(items: list[Container], f: pb.ContainerFilter) -> list[Container]:
    return [c for c in items if _prefix(c.id, f.id) and _prefix(c.sandbox_id, f.pod_sandbox_id)
            and (not f.HasField("state") or c.state.to_pb() == f.state.state)
            and labels_match(c.config.labels, f.label_selector)]


def _pod_uid(selector: Mapping[str, str]) -> str | None:
    return selector.get(POD_UID_LABEL)


class _ItemCache:
    """Each record's list item, serialized, rebuilt only when the (immutable) record object
    changed: a list answer is then one join of cached bytes (the server sends them as they are,
    see server.py), not a message per record built, copied and serialized per call."""

    def __init__(self) -> None:
        self._containers: dict[str, tuple[Container, bytes]] = {}
        self._sandboxes: dict[str, tuple[Sandbox, bytes]] = {}

    def containers(self, items: list[Container], complete: bool = True) -> bytes:
        """``complete``: ``items`` is every record, so entries of records gone can be pruned."""
        out = []
        for c in items:
            hit = self._containers.get(c.id)
            if hit is None or hit[0] is not c:
                hit = (c, convert.field1(convert.container_item(c).SerializeToString()))
                self._containers[c.id] = hit
            out.append(hit[1])
        if complete and len(self._containers) > 2 * len(items) + 64:
            live = {c.id for c in items}
            self._containers = {k: v for k, v in self._containers.items() if k in live}
        return b"".join(out)

    def sandboxes(self, items: list[Sandbox], complete: bool = True) -> bytes:
        out = []
        for sb in items:
            hit = self._sandboxes.get(sb.id)
            if hit is None or hit[0] is not sb:
                hit = (sb, convert.field1(convert.sandbox_item(sb).SerializeToString()))
                self._sandboxes[sb.id] = hit
            out.append(hit[1])
        if complete and len(self._sandboxes) > 2 * len(items) + 64:
            live = {sb.id for sb in items}
            self._sandboxes = {k: v for k, v in self._sandboxes.items() if k in live}
        return b"".join(out)


def exec_command_of(engine: Engine, container_id: str,
                    cmd: Sequence[str]) -> tuple[list[str], dict[str, str], str]:
    """How to run ``cmd`` in a running container (ExecSync's way); a Fault when it cannot."""
    c = engine.container(container_id)
    if c.state is not ContainerState.RUNNING:
        raise precondition(f"container {c.id} is not running")
    return execsync.exec_command(engine.spec(c.id), cmd, c.started.pid if c.started else 0)


def _running(engine: Engine, container_id: str) -> bool:
    try:
        return engine.container(container_id).state is ContainerState.RUNNING
    except Fault:
        return False


class RuntimeServicer(pb_grpc.RuntimeServiceServicer):  # type: ignore[misc]
    def __init__(self, engine: Engine, streaming: StreamingServer | None = None) -> None:
        self.streaming = streaming
        self.engine = engine
        self.stats = StatsCollector(engine.wall, engine.cgroup_dirs, engine.cgroups.usage)
        self._cache = _ItemCache()
        self._cache_lock = threading.Lock()
        # The server sets this when its serializers pass bytes through (server.py): list
        # answers and events are then sent as wire bytes, else as messages.
        self.raw_bytes = False

    @_guard
    def Version(self, request: pb.VersionRequest, context: Any) -> pb.VersionResponse:
        return pb.VersionResponse(version="0.1.0", runtime_name=RUNTIME_NAME,
                                  runtime_version=VERSION, runtime_api_version="v1")

    @_guard
    def Status(self, request: pb.StatusRequest, context: Any) -> pb.StatusResponse:
        conds = [pb.RuntimeCondition(type="RuntimeReady", status=True),
                 self.engine.network_condition()]
        return pb.StatusResponse(status=pb.RuntimeStatus(conditions=conds),
                                 runtime_handlers=self.engine.runtime_handlers())

    @_guard
    def RunPodSandbox(self, request: pb.RunPodSandboxRequest, context: Any) -> Any:
        sid = self.engine.run_sandbox(request.config, request.runtime_handler)
        return pb.RunPodSandboxResponse(pod_sandbox_id=sid)

    @_guard
    def StopPodSandbox(self, request: pb.StopPodSandboxRequest, context: Any) -> Any:
        self.engine.stop_sandbox(request.pod_sandbox_id)
        return pb.StopPodSandboxResponse()

    @_guard
    def RemovePodSandbox(self, request: pb.RemovePodSandboxRequest, context: Any) -> Any:
        self.engine.remove_sandbox(request.pod_sandbox_id)
        return pb.RemovePodSandboxResponse()

    @_guard
    def PodSandboxStatus(self, request: pb.PodSandboxStatusRequest, context: Any) -> Any:
        sb = self.engine.sandbox(request.pod_sandbox_id)
        statuses = [self.engine.status_of(c) for c in self.engine.containers_of(sb.id)]
        return pb.PodSandboxStatusResponse(status=convert.sandbox_status(sb),
                                           containers_statuses=statuses,
                                           timestamp=self.engine.wall())

    @_guard
    def ListPodSandbox(self, request: pb.ListPodSandboxRequest, context: Any) -> Any:
        if not request.HasField("filter"):
            items, complete = self.engine.sandboxes(), True
        else:
            f = request.filter
            candidates = self.engine.find_sandboxes(f.id, _pod_uid(f.label_selector))
            items, complete = _filter_sandboxes(candidates, f), False
        with self._cache_lock:
            wire = self._cache.sandboxes(items, complete)
        return wire if self.raw_bytes else pb.ListPodSandboxResponse.FromString(wire)

    @_guard
    def CreateContainer(self, request: pb.CreateContainerRequest, context: Any) -> Any:
        cid = self.engine.create_container(request.pod_sandbox_id, request.config)
        return pb.CreateContainerResponse(container_id=cid)

    @_guard
    def StartContainer(self, request: pb.StartContainerRequest, context: Any) -> Any:
        self.engine.start_container(request.container_id)
        return pb.StartContainerResponse()

    @_guard
    def StopContainer(self, request: pb.StopContainerRequest, context: Any) -> Any:
        self.engine.stop_container(request.container_id, int(request.timeout))
        return pb.StopContainerResponse()

    @_guard
    def RemoveContainer(self, request: pb.RemoveContainerRequest, context: Any) -> Any:
        self.engine.remove_container(request.container_id)
        self.stats.forget(request.container_id)
        return pb.RemoveContainerResponse()

    @_guard
    def ListContainers(self, request: pb.ListContainersRequest, context: Any) -> Any:
        if not request.HasField("filter"):
            items, complete = self.engine.containers(), True
        else:
            f = request.filter
            candidates = self.engine.find_containers(f.id, f.pod_sandbox_id,
                                                     _pod_uid(f.label_selector))
            items, complete = _filter_containers(candidates, f), False
        with self._cache_lock:
            wire = self._cache.containers(items, complete)
        return wire if self.raw_bytes else pb.ListContainersResponse.FromString(wire)

    @_guard
    def ContainerStatus(self, request: pb.ContainerStatusRequest, context: Any) -> Any:
        c = self.engine.container(request.container_id)
        return pb.ContainerStatusResponse(status=self.engine.status_of(c))

    @_guard
    def ExecSync(self, request: pb.ExecSyncRequest, context: Any) -> pb.ExecSyncResponse:
        c = self.engine.container(request.container_id)
        if c.state is not ContainerState.RUNNING:
            raise precondition(f"container {c.id} is not running")
        return execsync.exec_sync(self.engine.spec(c.id), list(request.cmd),
                                  int(request.timeout), c.started.pid if c.started else 0)

    @_guard
    def Exec(self, request: pb.ExecRequest, context: Any) -> pb.ExecResponse:
        if self.streaming is None:
            raise Fault(grpc.StatusCode.UNIMPLEMENTED, "no streaming server")
        exec_command_of(self.engine, request.container_id, list(request.cmd) or ["true"])
        url = self.streaming.exec_url(ExecRequest(
            request.container_id, tuple(request.cmd), request.stdin, request.stdout,
            request.stderr, request.tty))
        return pb.ExecResponse(url=url)

    @_guard
    def Attach(self, request: pb.AttachRequest, context: Any) -> pb.AttachResponse:
        """The container's output from now on (its log) and, for a container created with
        stdin (``kubectl run -it``), the client's input to its stdin or terminal through its
        monitor's attach socket (monitor.c ``STDIO``, stream_attach.py)."""
        if self.streaming is None:
            raise Fault(grpc.StatusCode.UNIMPLEMENTED, "no streaming server")
        c = self.engine.container(request.container_id)
        if c.state is not ContainerState.RUNNING:
            raise precondition(f"container {c.id} is not running")
        if request.stdin and not c.config.stdin:
            raise precondition("attach: the container was not created with stdin (stdin: "
                               "true), so it has no stdin to attach to; attach with "
                               "stdout/stderr only, or use exec")
        if request.tty and not c.config.tty:
            raise precondition("attach: the container has no terminal (tty: false)")
        engine, cid = self.engine, c.id
        url = self.streaming.attach_url(AttachRequest(
            cid, c.log_path, request.stdout, request.stderr,
            running=lambda: _running(engine, cid), stdin=request.stdin,
            tty=bool(c.config.tty),
            socket=engine.attach_path(cid) if request.stdin else ""))
        return pb.AttachResponse(url=url)

    @_guard
    def PortForward(self, request: pb.PortForwardRequest, context: Any) -> pb.PortForwardResponse:
        if self.streaming is None:
            raise Fault(grpc.StatusCode.UNIMPLEMENTED, "no streaming server")
        sb = self.engine.sandbox(request.pod_sandbox_id)
        if sb.state is not SandboxState.READY:
            raise precondition(f"pod sandbox {sb.id} is not ready")
        url = self.streaming.port_forward_url(PortForwardRequest(
            sb.id, tuple(request.port), sb.network.netns if sb.network is not None else ""))
        return pb.PortForwardResponse(url=url)

    @_guard
    def ReopenContainerLog(self, request: pb.ReopenContainerLogRequest, context: Any) -> Any:
        self.engine.reopen_log(request.container_id)
        return pb.ReopenContainerLogResponse()

    @_guard
    def ContainerStats(self, request: pb.ContainerStatsRequest, context: Any) -> Any:
        c = self.engine.container(request.container_id)
        return pb.ContainerStatsResponse(stats=self.stats.collect([c])[0])

    @_guard
    def ListContainerStats(self, request: pb.ListContainerStatsRequest, context: Any) -> Any:
        f = request.filter
        items = [c for c in self.engine.containers()
                 if _prefix(c.id, f.id) and _prefix(c.sandbox_id, f.pod_sandbox_id)
                 and labels_match(c.config.labels, f.label_selector)]
        wire = self.stats.collect_wire(items)
        return wire if self.raw_bytes else pb.ListContainerStatsResponse.FromString(wire)

    def _sandbox_stats(self, sb: Any) -> pb.PodSandboxStats:
        """A sandbox's stats: its containers' stats, and their sums as the pod's CPU and
        memory (running containers only; the embedded runtime has no pod-level cgroup of its
        own to read, nor network namespace counters)."""
        containers = self.stats.collect(self.engine.containers_of(sb.id))
        running = [c for c in containers if c.HasField("cpu")]
        now = self.engine.wall()

        def total(get: Callable[[pb.ContainerStats], int]) -> pb.UInt64Value:
            return pb.UInt64Value(value=sum(get(c) for c in running))

        linux = pb.LinuxPodSandboxStats(
            cpu=pb.CpuUsage(timestamp=now,
                            usage_core_nano_seconds=total(
                                lambda c: c.cpu.usage_core_nano_seconds.value),
                            usage_nano_cores=total(lambda c: c.cpu.usage_nano_cores.value)),
            memory=pb.MemoryUsage(timestamp=now,
                                  working_set_bytes=total(
                                      lambda c: c.memory.working_set_bytes.value),
                                  usage_bytes=total(lambda c: c.memory.usage_bytes.value),
                                  rss_bytes=total(lambda c: c.memory.rss_bytes.value)),
            containers=containers)
        attrs = pb.PodSandboxAttributes(id=sb.id, metadata=sb.config.metadata,
                                        labels=sb.config.labels,
                                        annotations=sb.config.annotations)
        return pb.PodSandboxStats(attributes=attrs, linux=linux)

    @_guard
    def PodSandboxStats(self, request: pb.PodSandboxStatsRequest, context: Any) -> Any:
        sb = self.engine.sandbox(request.pod_sandbox_id)
        return pb.PodSandboxStatsResponse(stats=self._sandbox_stats(sb))

    @_guard
    def ListPodSandboxStats(self, request: pb.ListPodSandboxStatsRequest, context: Any) -> Any:
        f = request.filter
        items = [sb for sb in self.engine.sandboxes()
                 if _prefix(sb.id, f.id) and labels_match(sb.config.labels, f.label_selector)]
        return pb.ListPodSandboxStatsResponse(stats=[self._sandbox_stats(sb) for sb in items])

    @_guard
    def UpdateContainerResources(
        self, request: pb.UpdateContainerResourcesRequest, context: Any
    ) -> Any:
        self.engine.update_resources(request.container_id, request.linux)
        return pb.UpdateContainerResourcesResponse()

    def GetContainerEvents(
        self, request: pb.GetEventsRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ContainerEventResponse | bytes]:
        sub = self.engine.events.subscribe()
        if sub is None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many event subscribers")
            return
        context.add_callback(sub.close)
        # Headers now: the client knows it is subscribed (EventStream.wait_subscribed) and
        # relists only after this point, so no event falls between its listing and the stream.
        context.send_initial_metadata(())
        try:
            # blocks until an event or close(): the callback closes it when the client goes
            # away or the server stops, so an idle stream wakes nobody
            while context.is_active() and not sub.closed:
                event = sub.get_wire() if self.raw_bytes else sub.get()
                if event is not None:
                    yield event
        finally:
            sub.close()


class ImageServicer(pb_grpc.ImageServiceServicer):  # type: ignore[misc]
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @_guard
    def ListImages(self, request: pb.ListImagesRequest, context: Any) -> Any:
        return pb.ListImagesResponse(images=self.engine.images.list(request.filter.image.image))

    @_guard
    def ImageStatus(self, request: pb.ImageStatusRequest, context: Any) -> Any:
        image = self.engine.images.resolve(request.image.image)
        if image is None:
            return pb.ImageStatusResponse()
        return pb.ImageStatusResponse(image=image)

    @_guard
    def PullImage(self, request: pb.PullImageRequest, context: Any) -> Any:
        auth = request.auth if request.HasField("auth") else None
        return pb.PullImageResponse(image_ref=self.engine.images.pull(request.image.image, auth))

    @_guard
    def RemoveImage(self, request: pb.RemoveImageRequest, context: Any) -> Any:
        self.engine.images.remove(request.image.image, self.engine.layers_in_use())
        return pb.RemoveImageResponse()

    @_guard
    def ImageFsInfo(self, request: pb.ImageFsInfoRequest, context: Any) -> Any:
        root = self.engine.store.root
        now = self.engine.wall()
        used, inodes = self.engine.images.usage()  # the store's real bytes (host: none)
        fs = pb.FilesystemUsage(
            timestamp=now, fs_id=pb.FilesystemIdentifier(mountpoint=str(root)),
            used_bytes=pb.UInt64Value(value=used), inodes_used=pb.UInt64Value(value=inodes))
        cfs = pb.FilesystemUsage(
            timestamp=now, fs_id=pb.FilesystemIdentifier(mountpoint=str(root)),
            used_bytes=pb.UInt64Value(value=self.engine.rootfs_usage()),
            inodes_used=pb.UInt64Value(value=0))
        return pb.ImageFsInfoResponse(image_filesystems=[fs], container_filesystems=[cfs])
