"""Probe handlers against real local servers on 127.0.0.1 (http, tcp, grpc) and exec over the CRI
fake. Slow servers block on an Event released at teardown, never on sleeps."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import psutil
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri.fake import FakeRuntimeClient
from podvisor.services.pod import (
    ExecAction,
    GRPCAction,
    HTTPGetAction,
    HTTPHeader,
    Probe,
    TCPSocketAction,
)
from podvisor.services.prober.handlers import (
    LazyClient,
    decode_health_status,
    encode_health_request,
    new_probe_runner,
    resolve_port,
    tcp_probe,
)
from podvisor.services.prober.httpprobe import http_get
from podvisor.services.prober.manager import Target
from podvisor.services.prober.worker import Result

S, F, U = Result.SUCCESS, Result.FAILURE, Result.UNKNOWN


class Handler(BaseHTTPRequestHandler):
    release: threading.Event
    seen: list[dict[str, str]]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: bytes = b"", location: str = "") -> None:
        self.send_response(code)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the prober stopped reading (10 KB) and reset
            self.wfile.write(body)

    def do_GET(self) -> None:
        self.seen.append({k.lower(): v for k, v in self.headers.items()} | {"path": self.path})
        path = self.path
        port = self.server.server_address[1]
        if path == "/ok":
            self._send(200, b"ok")
        elif path == "/fail":
            self._send(500, b"broken")
        elif path == "/notfound":
            self._send(404)
        elif path.startswith("/hop/"):
            n = int(path.split("/")[2])
            self._send(302, location="/ok" if n == 0 else f"/hop/{n - 1}")
        elif path == "/other-host":
            self._send(302, location=f"http://localhost:{port}/fail")
        elif path == "/big":
            self._send(200, b"x" * (1024 * 1024))
        elif path == "/slow":
            self.release.wait(30)
            self._send(200, b"late")
        elif path == "/header":
            self._send(200 if self.headers.get("X-Probe") == "yes" else 400)
        else:
            self._send(404)


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A probe that timed out closed its end before /slow answered: expected, not printed
        (socketserver would print the traceback into the test run's output)."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@pytest.fixture
def http_server() -> Iterator[tuple[int, type[Handler]]]:
    release = threading.Event()
    handler = type("H", (Handler,), {"release": release, "seen": []})
    server = QuietServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], handler
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


def get(port: int, path: str, timeout: float = 2.0, **kw: Any) -> Result:
    return http_get(HTTPGetAction(port=port, path=path, **kw), "127.0.0.1", port, timeout).result


@pytest.mark.parametrize(("path", "result"), [
    ("/ok", S), ("/fail", F), ("/notfound", F), ("/hop/3", S), ("/hop/9", S),
    ("/hop/10", F),  # 11 redirects: the 11th is refused
    ("/other-host", S),  # not followed: the 302 itself is the answer
    ("/big", S),
])
def test_http_results(http_server: tuple[int, type[Handler]], path: str, result: Result) -> None:
    assert get(http_server[0], path) is result


def test_http_headers_no_keepalive(http_server: tuple[int, type[Handler]]) -> None:
    port, handler = http_server
    assert get(port, "/header") is F
    assert get(port, "/header", http_headers=(HTTPHeader("X-Probe", "yes"),)) is S
    assert handler.seen[-1]["connection"] == "close"
    assert handler.seen[-1]["user-agent"].startswith("kube-probe/")
    assert not any(s["path"] == "/fail" for s in handler.seen)  # other host never followed


def test_http_slow_response_times_out(http_server: tuple[int, type[Handler]]) -> None:
    out = http_get(HTTPGetAction(port=http_server[0], path="/slow"), "127.0.0.1",
                   http_server[0], 0.3)
    assert out.result is F and "timed out" in out.message.lower()


def test_http_refused() -> None:
    port = closed_port()
    assert get(port, "/ok") is F


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_tcp_open_and_closed_no_time_wait() -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]
        for _ in range(3):
            assert tcp_probe("127.0.0.1", port, 1.0).result is S
        try:
            waits = [c for c in psutil.net_connections("tcp")
                     if c.status == psutil.CONN_TIME_WAIT and port in
                     (c.laddr.port if c.laddr else 0, c.raddr.port if c.raddr else 0)]
        except psutil.AccessDenied:
            waits = []
        assert waits == []
    assert tcp_probe("127.0.0.1", closed_port(), 1.0).result is F


def test_health_protobuf_round_trip() -> None:
    assert encode_health_request("") == b""
    assert encode_health_request("svc") == b"\x0a\x03svc"
    assert decode_health_status(b"\x08\x01") == 1
    assert decode_health_status(b"") == 0
    with pytest.raises(ValueError):
        decode_health_status(b"\x08")


@pytest.fixture
def grpc_port() -> Iterator[int]:
    statuses = {"": 1, "down": 2}

    def check(request: bytes, context: grpc.ServicerContext) -> bytes:
        service = request[2:].decode() if request else ""
        if service not in statuses:
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return b"\x08" + bytes([statuses[service]])

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(check)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(None).wait(5)


@pytest.mark.parametrize(("service", "result"), [("", S), ("down", F), ("missing", F)])
def test_grpc_health(grpc_port: int, service: str, result: Result) -> None:
    runner = new_probe_runner(FakeRuntimeClient())
    probe = Probe(GRPCAction(port=grpc_port, service=service))
    assert runner.run(probe, Target("127.0.0.1", {}, "c1")).result is result


def test_grpc_nothing_listening() -> None:
    runner = new_probe_runner(FakeRuntimeClient())
    out = runner.run(Probe(GRPCAction(port=closed_port())), Target("127.0.0.1", {}, "c1"))
    assert out.result is F


def fake_container(cri: FakeRuntimeClient) -> str:
    scfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p", uid="u1"))
    sid = cri.run_pod_sandbox(scfg)
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"),
                             image=pb.ImageSpec(image="host"))
    cid = cri.create_container(sid, cfg, scfg)
    cri.start_container(cid)
    return cid


def test_exec_via_cri() -> None:
    cri = FakeRuntimeClient()
    cid = fake_container(cri)
    runner = new_probe_runner(cri)
    probe = Probe(ExecAction(("cat", "/tmp/ready")), timeout_seconds=3)
    assert runner.run(probe, Target("127.0.0.1", {}, cid)).result is S
    assert cri.calls[-1] == ("ExecSync", (cid, ("cat", "/tmp/ready"), 3.0))
    cri.exec_results[cid] = pb.ExecSyncResponse(exit_code=1, stderr=b"no such file")
    out = runner.run(probe, Target("127.0.0.1", {}, cid))
    assert out.result is F and "no such file" in out.message
    cri.fail("ExecSync", grpc.StatusCode.DEADLINE_EXCEEDED, times=1)
    assert runner.run(probe, Target("127.0.0.1", {}, cid)).result is F
    cri.fail("ExecSync", grpc.StatusCode.UNAVAILABLE, times=1)
    assert runner.run(probe, Target("127.0.0.1", {}, cid)).result is U
    assert runner.run(probe, Target("127.0.0.1", {}, "gone")).result is U


def test_the_cri_client_is_made_at_the_first_exec_probe_only(
        http_server: tuple[int, type[Handler]]) -> None:
    cri = FakeRuntimeClient()
    cid = fake_container(cri)
    made: list[FakeRuntimeClient] = []
    lazy = LazyClient(lambda: made.append(cri) or cri)
    runner = new_probe_runner(lazy)
    target = Target("127.0.0.1", {}, cid)
    assert runner.run(Probe(TCPSocketAction(port=http_server[0])), target).result is S
    assert not lazy.connected and made == []  # no exec probe yet: no gRPC channel
    probe = Probe(ExecAction(("true",)), timeout_seconds=3)
    assert runner.run(probe, target).result is S
    assert runner.run(probe, target).result is S
    assert lazy.connected and len(made) == 1
    lazy.close()
    assert not lazy.connected


def test_named_ports_and_runner_dispatch(http_server: tuple[int, type[Handler]]) -> None:
    port = http_server[0]
    assert resolve_port("web", {"web": port}) == port and resolve_port(81, {}) == 81
    runner = new_probe_runner(FakeRuntimeClient())
    target = Target("127.0.0.1", {"web": port}, "c1")
    assert runner.run(Probe(HTTPGetAction(port="web", path="/ok")), target).result is S
    assert runner.run(Probe(TCPSocketAction(port="web")), target).result is S
    out = runner.run(Probe(TCPSocketAction(port="nope")), target)
    assert out.result is F and "nope" in out.message
