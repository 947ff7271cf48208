"""Probe handlers behind one interface: ``ProbeRunner.run(probe, target) -> Outcome``.

- exec: CRI ``ExecSync`` with the probe's timeout; exit 0 = success. A timeout is a failure; an
  unreachable runtime or a container that is gone is UNKNOWN (not counted by the worker).
- httpGet: ``httpprobe.http_get`` (status 200-399, same-host redirects, 10 KB body, no keep-alive).
- tcpSocket: connect within the timeout, then close with SO_LINGER 0 (an RST, no TIME_WAIT on the
  node: kubernetes #89898).
- grpc: ``grpc.health.v1.Health/Check`` as a generic unary call with hand-encoded protobuf bytes
  (the messages are one field each); SERVING = success.

Handlers never raise: any error is a FAILURE (or UNKNOWN, see above) with a message.
``new_probe_runner(cri)`` builds the real one; ``FakeRunner`` is for unit tests.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Mapping
from typing import Protocol

import grpc

from podvisor.services.cri import CriError, RuntimeClient
from podvisor.services.pod import ExecAction, GRPCAction, HTTPGetAction, Probe, TCPSocketAction
from podvisor.services.prober.httpprobe import http_get
from podvisor.services.prober.manager import Target
from podvisor.services.prober.outcome import Outcome, set_linger_zero
from podvisor.services.prober.worker import Result

SUCCESS = Outcome(Result.SUCCESS)
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
SERVING = 1
STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


class ProbeRunner(Protocol):
    def run(self, probe: Probe, target: Target) -> Outcome: ...


def resolve_port(port: int | str, ports: Mapping[str, int]) -> int:
    """A port number, or a container port's name looked up in ``ports``."""
    if isinstance(port, int):
        return port
    if port.isdigit():
        return int(port)
    if port not in ports:
        raise ValueError(f"port name {port!r} not found in the container's ports")
    return ports[port]


def tcp_probe(host: str, port: int, timeout: float) -> Outcome:
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as err:
        return Outcome(Result.FAILURE, f"dial tcp {host}:{port}: {err}")
    try:
        set_linger_zero(sock)
    finally:
        sock.close()
    return Outcome(Result.SUCCESS)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def encode_health_request(service: str) -> bytes:
    """``HealthCheckRequest{string service = 1}``."""
    raw = service.encode()
    return b"\x0a" + _varint(len(raw)) + raw if raw else b""


def decode_health_status(data: bytes) -> int:
    """``HealthCheckResponse{ServingStatus status = 1}``: the status, unknown fields skipped."""
    i, status = 0, 0
    while i < len(data):
        key, i = _read_varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
            if field == 1:
                status = value
        elif wire == 2:
            length, i = _read_varint(data, i)
            i += length
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
    if i > len(data):
        raise ValueError("truncated protobuf message")
    return status


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(data) or shift > 63:
            raise ValueError("truncated protobuf varint")
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def grpc_probe(host: str, port: int, service: str, timeout: float) -> Outcome:
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    channel = grpc.insecure_channel(address, options=[("grpc.enable_retries", 0)])
    try:
        check = channel.unary_unary(HEALTH_CHECK)
        reply = check(encode_health_request(service), timeout=timeout)
        status = decode_health_status(bytes(reply))
    except grpc.RpcError as err:
        code = err.code() if isinstance(err, grpc.Call) else None
        return Outcome(Result.FAILURE, f"grpc health check {address}: {code}: "
                       f"{err.details() if isinstance(err, grpc.Call) else err}")
    except ValueError as err:
        return Outcome(Result.FAILURE, f"grpc health check {address}: bad reply: {err}")
    finally:
        channel.close()
    if status != SERVING:
        return Outcome(Result.FAILURE, f"service unhealthy (responded with "
                       f"\"{STATUS_NAMES.get(status, status)}\")")
    return Outcome(Result.SUCCESS)


def exec_probe(cri: RuntimeClient, container_id: str, command: tuple[str, ...],
               timeout: float) -> Outcome:
    try:
        resp = cri.exec_sync(container_id, list(command), timeout)
    except CriError as err:
        if err.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND):
            return Outcome(Result.UNKNOWN, str(err))
        if err.code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return Outcome(Result.FAILURE, f"command timed out after {timeout:g}s")
        return Outcome(Result.FAILURE, str(err))
    if resp.exit_code != 0:
        out = (bytes(resp.stdout) + bytes(resp.stderr))[:1024].decode(errors="replace")
        return Outcome(Result.FAILURE, f"exit code {resp.exit_code}: {out.strip()}")
    return Outcome(Result.SUCCESS)


class LazyClient:
    """The CRI client, made at the first exec probe (thread-safe): an idle gRPC channel costs
    ~0.4 ms of CPU a second (its threads wake ~7 times a second), and most pods have no exec
    probe."""

    def __init__(self, connect: Callable[[], RuntimeClient]) -> None:
        self._connect = connect
        self._client: RuntimeClient | None = None
        self._lock = threading.Lock()

    @property
    def connected(self) -> bool:
        return self._client is not None

    def get(self) -> RuntimeClient:
        with self._lock:
            if self._client is None:
                self._client = self._connect()
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


class _Runner:
    def __init__(self, cri: RuntimeClient | LazyClient) -> None:
        self._client = cri

    @property
    def _cri(self) -> RuntimeClient:
        return self._client.get() if isinstance(self._client, LazyClient) else self._client

    def run(self, probe: Probe, target: Target) -> Outcome:
        h = probe.handler
        timeout = float(probe.timeout_seconds)
        try:
            if isinstance(h, ExecAction):
                return exec_probe(self._cri, target.container_id, h.command, timeout)
            if isinstance(h, HTTPGetAction):
                return http_get(h, target.host, resolve_port(h.port, target.ports), timeout)
            if isinstance(h, TCPSocketAction):
                return tcp_probe(h.host or target.host, resolve_port(h.port, target.ports),
                                 timeout)
            if isinstance(h, GRPCAction):
                return grpc_probe(target.host, h.port, h.service, timeout)
        except Exception as err:  # a handler bug must not take the prober down
            return Outcome(Result.FAILURE, f"probe error: {type(err).__name__}: {err}")
        return Outcome(Result.FAILURE, f"unsupported probe handler {type(h).__name__}")


def new_probe_runner(cri: RuntimeClient | LazyClient) -> ProbeRunner:
    """``cri``: the client exec probes use, or a ``LazyClient`` that makes it when needed."""
    return _Runner(cri)


class FakeRunner:
    """Scripted outcomes for unit tests: ``decide(probe, target)`` or a default.
    Records every call in ``calls`` as ``(container_id, probe)``; thread-safe."""

    def __init__(self, default: Outcome = SUCCESS,
                 decide: Callable[[Probe, Target], Outcome] | None = None) -> None:
        self.default = default
        self.decide = decide
        self.calls: list[tuple[str, Probe]] = []
        self._lock = threading.Lock()

    def run(self, probe: Probe, target: Target) -> Outcome:
        with self._lock:
            self.calls.append((target.container_id, probe))
        return self.decide(probe, target) if self.decide is not None else self.default
