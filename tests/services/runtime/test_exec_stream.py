"""CRI Exec: the URL it returns, and a real WebSocket client (aiohttp) speaking
``v5.channel.k8s.io``/``v4.channel.k8s.io`` to the runtime's streaming server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError
from tests.services.conftest import runs_processes


async def ws_exec(url: str, protocol: str, stdin: bytes | None,
                  close_stdin: bool = True) -> tuple[bytes, bytes, dict[str, Any]]:
    """Run the exec behind ``url``; (stdout, stderr, status) once the server closes."""
    out, err, status = b"", b"", {}
    async with aiohttp.ClientSession() as session, session.ws_connect(
            url, protocols=(protocol,), headers={"Origin": "http://127.0.0.1"}) as ws:
        assert ws.protocol == protocol
        if stdin is not None:
            await ws.send_bytes(b"\x00" + stdin)
            if close_stdin:
                await ws.send_bytes(b"\xff\x00")
        async for msg in ws:
            if msg.type is not aiohttp.WSMsgType.BINARY:
                continue
            channel, data = msg.data[0], msg.data[1:]
            if channel == 1:
                out += data
            elif channel == 2:
                err += data
            elif channel == 3:
                status = json.loads(data)
    return out, err, status


def exec_url(rt: Any, cid: str, cmd: list[str], stdin: bool = False) -> str:
    return str(rt.client.exec(pb.ExecRequest(container_id=cid, cmd=cmd, stdin=stdin,
                                             stdout=True, stderr=True)))


def test_exec_websocket_output_exit_code_and_stdin(cri_runtime: Any) -> None:
    """containerd's streaming server speaks v4 (not v5) and needs an Origin header."""
    runs_processes(cri_runtime, "exec streaming")
    v5 = cri_runtime.name == "embedded"
    proto = "v5.channel.k8s.io" if v5 else "v4.channel.k8s.io"
    cid = cri_runtime.start(cri_runtime.run("wsexec"), "target", ["sleep", "1000"])

    url = exec_url(cri_runtime, cid, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert url.startswith("http://127.0.0.1:") or url.startswith("http://[::1]:")
    out, err, status = asyncio.run(ws_exec(url, proto, None))
    assert (out, err) == (b"out\n", b"err\n")
    assert status["status"] == "Failure" and status["reason"] == "NonZeroExitCode"
    assert status["details"]["causes"] == [{"reason": "ExitCode", "message": "3"}]

    url = exec_url(cri_runtime, cid, ["sh", "-c", 'read line; echo "got $line"'], stdin=True)
    out, _, status = asyncio.run(ws_exec(url, proto, b"one\n", close_stdin=False))
    assert out == b"got one\n"
    assert status == {"metadata": {}, "status": "Success"}

    url = exec_url(cri_runtime, cid, ["echo", "v4"])
    out, _, status = asyncio.run(ws_exec(url, "v4.channel.k8s.io", None))
    assert out == b"v4\n" and status["status"] == "Success"
    if v5:  # v5 closes stdin: the command sees end of file
        url = exec_url(cri_runtime, cid, ["cat"], stdin=True)
        out, _, status = asyncio.run(ws_exec(url, proto, b"from stdin\n"))
        assert out == b"from stdin\n" and status["status"] == "Success"


def test_exec_token_is_single_use(cri_runtime: Any) -> None:
    runs_processes(cri_runtime, "exec streaming")
    if cri_runtime.name == "containerd":
        pytest.skip("embedded streaming server only")
    cid = cri_runtime.start(cri_runtime.run("wsonce"), "target", ["sleep", "1000"])
    url = exec_url(cri_runtime, cid, ["true"])
    asyncio.run(ws_exec(url, "v5.channel.k8s.io", None))

    async def again() -> int:
        async with aiohttp.ClientSession() as session, session.get(url) as resp:
            return resp.status
    assert asyncio.run(again()) == 404


def test_exec_refuses_what_it_cannot_do(cri_runtime: Any) -> None:
    runs_processes(cri_runtime, "exec streaming")
    if cri_runtime.name == "containerd":
        pytest.skip("embedded streaming server only")
    cid = cri_runtime.start(cri_runtime.run("wsbad"), "target", ["sleep", "1000"])
    with pytest.raises(CriError) as info:
        cri_runtime.client.exec(pb.ExecRequest(container_id=cid, cmd=[], stdout=True))
    assert "empty command" in str(info.value)
    with pytest.raises(CriError) as info:
        cri_runtime.client.exec(pb.ExecRequest(container_id="nope", cmd=["true"], stdout=True))


def test_tokens_expire_unused() -> None:
    from podvisor.ipc.clock import FakeClock
    from podvisor.services.runtime.streaming import ExecRequest, StreamingServer

    clock = FakeClock()
    server = StreamingServer(lambda cid, cmd: (list(cmd), {}, "/"), log=None, clock=clock,
                             ttl=60.0)
    req = ExecRequest("c1", ("true",), False, True, False, False)
    fresh = server.exec_url(req).rsplit("/", 1)[1]
    stale = server.exec_url(req).rsplit("/", 1)[1]
    assert server._take(fresh) == req
    assert server._take(fresh) is None  # single use
    clock.advance(61.0)
    assert server._take(stale) is None  # expired


def test_exec_stream_runs_as_the_container(cri_runtime: Any) -> None:
    """The streamed command gets the container's user, groups, caps and no_new_privs, as
    ExecSync's (the same argv)."""
    from tests.services.cri.test_contract_security import REPORT

    runs_processes(cri_runtime, "a process's identity")
    sid, sconfig = cri_runtime.run("wsid")
    config = cri_runtime.container_config("c", ["sleep", "1000"])
    sc = config.linux.security_context
    sc.run_as_user.value = 65534
    sc.run_as_group.value = 65534
    sc.supplemental_groups.append(4321)
    sc.no_new_privs = True
    cid = cri_runtime.client.create_container(sid, config, sconfig)
    cri_runtime.client.start_container(cid)
    proto = "v5.channel.k8s.io" if cri_runtime.name == "embedded" else "v4.channel.k8s.io"
    out, err, status = asyncio.run(ws_exec(exec_url(cri_runtime, cid, ["sh", "-c", REPORT]),
                                           proto, None))
    text = out.decode()
    assert status["status"] == "Success", err
    assert "uid=65534 gid=65534" in text and "4321" in text, text
    assert "CapEff:0000000000000000" in text and "NoNewPrivs:1" in text, text
