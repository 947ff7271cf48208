"""The CRI proxy (``criProxy: true`` with a remote ``runtimeEndpoint``, issue 28): the ``runtime``
process serves ``paths.cri_socket`` and forwards every runtime.v1 and image.v1 call, as bytes, to
the configured runtime (containerd), so that the injected ``cri`` faults (``faultgate.py``:
latency, a status code, a hang on chosen methods) apply to a remote runtime exactly as they do
to the embedded one. The node's CRI clients dial the proxy (``common/endpoint.py``
``cri_endpoint``); podvisorctl's offline paths (``shutdown --pods`` with no agent, ``images``)
dial the runtime itself.

Nothing is decoded: a request's bytes, deadline (what is left of it) and metadata go upstream
as they came, the answer's bytes (or its status code and details) come back as they went; a
server stream (``GetContainerEvents``) is forwarded message by message and cancelled upstream
when the client goes. The process's liveness probe (``liveness.py``) asks ``Version`` through
the proxy: a proxy that cannot reach containerd, or a hang injected on it, silences its
heartbeat and the supervisor replaces it, as it would a hung embedded runtime.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from podvisor.common.logs import Log as Logger
from podvisor.common.pool import ElasticPool
from podvisor.ipc.paths import MAX_SOCKET_PATH
from podvisor.services.runtime.faultgate import CriFaults, FaultInterceptor

__all__ = ["CriProxy"]

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_WORKERS = 64
SERVICES = ("/runtime.v1.RuntimeService/", "/runtime.v1.ImageService/")
STREAMING = frozenset({"/runtime.v1.RuntimeService/GetContainerEvents"})  # server streams
_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]


def _identity(data: bytes) -> bytes:
    return data


def _forwarded_metadata(context: grpc.ServicerContext) -> tuple[tuple[str, Any], ...]:
    """The caller's metadata minus what gRPC itself sets (pseudo-headers, ``grpc-*``)."""
    return tuple((k, v) for k, v in context.invocation_metadata()
                 if not k.startswith(":") and not k.startswith("grpc-")
                 and k not in ("user-agent", "content-type", "te"))


def _timeout(context: grpc.ServicerContext) -> float | None:
    left = context.time_remaining()
    return None if left is None or left > 1e9 else max(left, 0.0)


class _Forward(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, channel: grpc.Channel) -> None:
        self._channel = channel

    def service(self, handler_call_details: Any) -> Any:
        method = str(handler_call_details.method)
        if not method.startswith(SERVICES):
            return None
        if method in STREAMING:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(method), request_deserializer=_identity,
                response_serializer=_identity)
        return grpc.unary_unary_rpc_method_handler(
            self._unary(method), request_deserializer=_identity, response_serializer=_identity)

    def _unary(self, method: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        call = self._channel.unary_unary(method, request_serializer=_identity,
                                         response_deserializer=_identity)

        def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                answer: bytes = call(request, timeout=_timeout(context),
                                     metadata=_forwarded_metadata(context))
            except grpc.RpcError as err:
                context.abort(err.code(), err.details() or "")
            return answer
        return forward

    def _stream(self, method: str) -> Callable[[bytes, grpc.ServicerContext], Iterator[bytes]]:
        call = self._channel.unary_stream(method, request_serializer=_identity,
                                          response_deserializer=_identity)

        def forward(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            upstream = call(request, timeout=_timeout(context),
                            metadata=_forwarded_metadata(context))
            context.add_callback(upstream.cancel)  # the client went: so does the upstream call
            try:
                yield from upstream
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.CANCELLED or context.is_active():
                    context.abort(err.code(), err.details() or "")
        return forward


class CriProxy:
    """Serves ``socket_path``, forwarding to ``upstream`` (``unix:///...``); the ``RuntimeServer``
    shape the runtime process's loop needs (``start``, ``stop``, ``socket_path``, ``faults``)."""

    def __init__(self, upstream: str, socket_path: Path, log: Logger,
                 faults: CriFaults | None = None) -> None:
        self.upstream = upstream
        self.socket_path = socket_path
        self.log = log
        self.faults = faults or CriFaults()
        self._channel: grpc.Channel | None = None
        self._server: Any = None

    def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)  # a stale socket of a killed predecessor
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self._channel = grpc.insecure_channel(self.upstream, options=_OPTIONS)
        server = grpc.server(ElasticPool(max_workers=MAX_WORKERS, thread_name_prefix="criproxy"),
                             handlers=[_Forward(self._channel)],
                             interceptors=[FaultInterceptor(self.faults)],
                             options=[*_OPTIONS, ("grpc.so_reuseport", 0)])
        # bound under a temporary name and renamed once listening (as RuntimeServer does)
        tmp = self.socket_path.with_name(f".{self.socket_path.name}.{os.getpid()}")
        if len(os.fsencode(str(tmp))) > MAX_SOCKET_PATH:
            tmp = self.socket_path
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if server.add_insecure_port(f"unix://{tmp}") == 0:
            raise RuntimeError(f"cannot listen on unix://{tmp}")
        server.start()
        os.chmod(tmp, 0o600)
        if tmp != self.socket_path:
            os.rename(tmp, self.socket_path)
        self._server = server
        self.log.info("runtime.proxying", socket=str(self.socket_path), upstream=self.upstream)

    def stop(self, grace: float = 1.0) -> None:
        self.faults.close()
        if self._server is not None:
            self._server.stop(grace).wait(grace + 1)
            self._server = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self.log.info("runtime.stopped", socket=str(self.socket_path))
