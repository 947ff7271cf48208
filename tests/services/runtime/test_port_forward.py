"""CRI PortForward: a SPDY client (data + error stream per request, client-go's way) and a
WebSocket client (the kubelet's port-forward channels) through the runtime's streaming URL to a
TCP server listening on the sandbox's localhost (the test sandboxes use the host network: the
server is this test's own), on the embedded runtime and on containerd."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError
from tests.services.conftest import runs_processes
from tests.support.spdy_client import spdy_port_forward


@pytest.fixture
def upper_server() -> Iterator[int]:
    """A TCP server on 127.0.0.1: answers each connection's first line upper-cased, then
    closes it (as an HTTP/1.0 server would: a reply, then the end)."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\n" not in data and (chunk := conn.recv(65536)):
                    data += chunk
                conn.sendall(data.upper())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(srv.getsockname()[1])
    stop.set()
    with contextlib.suppress(OSError):
        srv.shutdown(socket.SHUT_RDWR)
    srv.close()
    thread.join(5)


def _url(rt: Any, sid: str, ports: list[int]) -> str:
    return str(rt.client.port_forward(pb.PortForwardRequest(pod_sandbox_id=sid, port=ports)))


async def _spdy(url: str, port: int, payload: bytes) -> bytes:
    got = await spdy_port_forward(url, port, payload)
    assert got.status_code == 101 and got.protocol == "portforward.k8s.io", got
    assert got.error == b"", got
    return got.stdout


def test_port_forward_spdy(cri_runtime: Any, upper_server: int) -> None:
    runs_processes(cri_runtime, "port forward")
    sid, _ = cri_runtime.run("pfspdy")
    url = _url(cri_runtime, sid, [upper_server])
    assert asyncio.run(_spdy(url, upper_server, b"hello " * 10000 + b"\n")) == \
        b"HELLO " * 10000 + b"\n"
    # a port nobody listens on: the error stream says so
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    got = asyncio.run(spdy_port_forward(_url(cri_runtime, sid, [closed]), closed, b"x\n"))
    assert got.status_code == 101 and str(closed).encode() in got.error, got


def test_port_forward_websocket(cri_runtime: Any, upper_server: int) -> None:
    runs_processes(cri_runtime, "port forward")
    sid, _ = cri_runtime.run("pfws")
    url = _url(cri_runtime, sid, [upper_server])

    async def run() -> tuple[list[bytes], bytes]:
        firsts: list[bytes] = []
        data = b""
        async with aiohttp.ClientSession() as session, session.ws_connect(
                f"{url}?port={upper_server}", protocols=("v4.channel.k8s.io",),
                headers={"Origin": "http://127.0.0.1"}) as ws:
            seen: set[int] = set()
            async for msg in ws:
                if msg.type is not aiohttp.WSMsgType.BINARY:
                    continue
                channel, payload = msg.data[0], msg.data[1:]
                if channel not in seen:  # each channel's first message: the port
                    seen.add(channel)
                    firsts.append(payload)
                    if seen == {0, 1}:
                        await ws.send_bytes(b"\x00abc\n")
                    continue
                if channel == 0:
                    data += payload
                    if data == b"ABC\n":
                        break
        return firsts, data
    firsts, data = asyncio.run(run())
    assert firsts == [upper_server.to_bytes(2, "little")] * 2
    assert data == b"ABC\n"


def test_port_forward_refusals(cri_runtime: Any) -> None:
    runs_processes(cri_runtime, "port forward")
    if cri_runtime.name != "embedded":
        pytest.skip("embedded streaming server only")
    with pytest.raises(CriError) as info:
        _url(cri_runtime, "no-such-sandbox", [80])
    assert info.value.code.name == "NOT_FOUND"
