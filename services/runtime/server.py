"""The embedded runtime's gRPC server on a unix socket: Engine + servicers, started and stopped
as one unit. Used by the supervised process (main.py) and the standalone entry (__main__.py)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cri_api.v1 import api_pb2_grpc as pb_grpc

from podvisor.common.crashpoints import NEVER, CrashPoints
from podvisor.common.logs import Log as Logger
from podvisor.common.pool import ElasticPool
from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.paths import MAX_SOCKET_PATH
from podvisor.ipc.rlimits import raise_nofile_limit
from podvisor.services.runtime.cni import DEFAULT_BIN_DIRS, Cni
from podvisor.services.runtime.engine import Engine
from podvisor.services.runtime.faultgate import CriFaults, FaultInterceptor
from podvisor.services.runtime.servicer import ImageServicer, RuntimeServicer, exec_command_of
from podvisor.services.runtime.streaming import StreamingServer

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_WORKERS = 64


class _Capture:
    """Stands in for the server while generated code registers a servicer."""

    def __init__(self) -> None:
        self.name = ""
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]) -> None:
        self.name, self.handlers = name, dict(handlers)


def _passing_bytes(serialize: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    return lambda response: response if isinstance(response, bytes) else serialize(response)


def _add_passing_bytes(server: Any, add: Callable[[Any, Any], None], servicer: Any,
                       methods: tuple[str, ...]) -> bool:
    """Register ``servicer`` as the generated ``add`` would, except that ``methods`` may return
    already-serialized responses (bytes). False when the generated code could not be followed
    (then it registered as usual, and those methods must return messages)."""
    capture = _Capture()
    add(servicer, capture)
    if not capture.name or not all(m in capture.handlers for m in methods):
        add(servicer, server)
        return False
    handlers = capture.handlers
    for m in methods:
        handlers[m] = handlers[m]._replace(
            response_serializer=_passing_bytes(handlers[m].response_serializer))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(capture.name, handlers),))
    server.add_registered_method_handlers(capture.name, handlers)
    return True


@dataclass(frozen=True)
class NetworkSettings:
    """``networkPlugin`` (``cni`` or ``host``), ``cniConfDir``, ``cniBinDir``."""

    plugin: str
    conf_dir: str
    bin_dirs: str


class RuntimeServer:
    def __init__(self, root: Path, socket_path: Path, log: Logger,
                 registries: Mapping[str, Any] | None = None,
                 crash: CrashPoints = NEVER, network: NetworkSettings | None = None,
                 faults: CriFaults | None = None) -> None:
        """``crash``: fault-injection tests' crash points (engine.py ``STEPS``);
        ``network``: the pod network (``networkPlugin`` and the CNI directories; default: the
        host's network, with the CNI conf dir under ``root``); ``faults``: the injected ``cri``
        faults its servicer applies (``faultgate.py``)."""
        self.faults = faults or CriFaults()
        self.root = root
        self.socket_path = socket_path
        self.log = log
        net = network or NetworkSettings("host", str(root / "cni" / "net.d"), DEFAULT_BIN_DIRS)
        cni = Cni(root, Path(net.conf_dir), net.bin_dirs)
        self.engine = Engine(root, log, registries=registries, crash=crash, cni=cni,
                             pod_network=net.plugin == "cni")
        self._server: Any = None
        self._runtime: RuntimeServicer | None = None
        self.streaming: StreamingServer | None = None

    def start(self) -> None:
        old, new = raise_nofile_limit()  # a descriptor per container: no 1,024 ceiling
        if old != new:
            self.log.info("runtime.nofile_raised", soft_was=old, soft=new)
        self.root.mkdir(parents=True, exist_ok=True)
        self.engine.start()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)  # a stale socket of a killed predecessor
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(
            ElasticPool(max_workers=MAX_WORKERS, thread_name_prefix="cri"),
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
            interceptors=[FaultInterceptor(self.faults)],
        )
        stubs: Any = pb_grpc
        self.streaming = StreamingServer(self.engine_exec_command, self.log,
                                         SYSTEM_CLOCK.monotonic)
        self.streaming.start()
        runtime = self._runtime = RuntimeServicer(self.engine, self.streaming)
        runtime.raw_bytes = _add_passing_bytes(
            server, stubs.add_RuntimeServiceServicer_to_server, runtime,
            ("ListContainers", "ListPodSandbox", "GetContainerEvents", "ListContainerStats"))
        stubs.add_ImageServiceServicer_to_server(ImageServicer(self.engine), server)
        # Bound under a temporary name and renamed once listening: the socket file exists only
        # when connecting to it works (a client that waits for the file is never refused).
        tmp = self.socket_path.with_name(f".{self.socket_path.name}.{os.getpid()}")
        if len(os.fsencode(str(tmp))) > MAX_SOCKET_PATH:
            tmp = self.socket_path  # no room for the longer name: bind it directly
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if server.add_insecure_port(f"unix://{tmp}") == 0:
            raise RuntimeError(f"cannot listen on unix://{tmp}")
        server.start()
        os.chmod(tmp, 0o600)
        if tmp != self.socket_path:
            os.rename(tmp, self.socket_path)
        self._server = server
        self.log.info("runtime.serving", socket=str(self.socket_path), root=str(self.root))

    def engine_exec_command(self, container_id: str,
                            cmd: Any) -> tuple[list[str], dict[str, str], str]:
        return exec_command_of(self.engine, container_id, cmd)

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving. Containers and their monitors keep running."""
        self.engine.events.close_all()
        self.faults.close()
        if self.streaming is not None:
            self.streaming.stop()
            self.streaming = None
        if self._server is not None:
            self._server.stop(grace).wait(grace + 1)
            self._server = None
        if self._runtime is not None:
            self._runtime.stats.close()
            self._runtime = None
        self.engine.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self.log.info("runtime.stopped", socket=str(self.socket_path))
