"""CRI Exec over SPDY/3.1 (``v4.channel.k8s.io``, one SPDY stream per channel, as client-go's
remotecommand): a Python client over ``podvisor.common.spdy`` against the runtime's streaming
server, on the embedded runtime and on containerd (whose server is Go's spdystream: the same
client against both is the framing's cross-check)."""

from __future__ import annotations

import asyncio
from typing import Any

from cri_api.v1 import api_pb2 as pb

from tests.services.conftest import runs_processes
from tests.support.spdy_client import spdy_exec


def _url(rt: Any, cid: str, cmd: list[str], *, stdin: bool = False,
         tty: bool = False) -> str:
    return str(rt.client.exec(pb.ExecRequest(container_id=cid, cmd=cmd, stdin=stdin,
                                             stdout=True, stderr=not tty, tty=tty)))


def test_exec_spdy_output_exit_code_stdin(cri_runtime: Any) -> None:
    runs_processes(cri_runtime, "exec streaming")
    cid = cri_runtime.start(cri_runtime.run("spdyexec"), "target", ["sleep", "1000"])
    got = asyncio.run(spdy_exec(_url(cri_runtime, cid, ["sh", "-c",
                                                        "echo out; echo err >&2; exit 3"])))
    assert (got.status_code, got.protocol) == (101, "v4.channel.k8s.io")
    assert (got.stdout, got.stderr) == (b"out\n", b"err\n")
    assert got.status["reason"] == "NonZeroExitCode"
    assert got.status["details"]["causes"] == [{"reason": "ExitCode", "message": "3"}]
    got = asyncio.run(spdy_exec(_url(cri_runtime, cid, ["cat"], stdin=True),
                                stdin=b"x" * 200_000))
    assert got.stdout == b"x" * 200_000
    assert got.status.get("status", "Success") == "Success"


def test_exec_spdy_tty_with_resize(cri_runtime: Any) -> None:
    runs_processes(cri_runtime, "exec streaming")
    cid = cri_runtime.start(cri_runtime.run("spdytty"), "target", ["sleep", "1000"])
    # stty prints the size after the resize was applied: "ready" comes once it is 40x120
    script = ("test -t 0 && test -t 1 && echo tty; "
              "while [ \"$(stty size)\" != '40 120' ]; do :; done; echo ready; "
              "read line; echo \"[$line]\"; stty size")
    url = _url(cri_runtime, cid, ["sh", "-c", script], stdin=True, tty=True)
    got = asyncio.run(spdy_exec(url, stdin=b"40 120\n", tty=True, resize=(120, 40),
                                close_stdin=False, stdin_after=b"ready"))
    lines = got.stdout.replace(b"\r", b"").decode().splitlines()
    # the terminal echoes what was typed; "stty size" prints rows then columns
    assert "tty" in lines and "[40 120]" in lines, got
    assert lines[-1] == "40 120", got


def test_exec_spdy_older_protocols_and_refusal(cri_runtime: Any) -> None:
    """v3/v2 (what older clients offer first) put the error text, not a Status, on the error
    stream and nothing on success; a protocol nobody serves is 403."""
    runs_processes(cri_runtime, "exec streaming")
    cid = cri_runtime.start(cri_runtime.run("spdyold"), "target", ["sleep", "1000"])
    got = asyncio.run(spdy_exec(_url(cri_runtime, cid, ["sh", "-c", "echo x; exit 5"]),
                                protocols=("v3.channel.k8s.io", "v2.channel.k8s.io")))
    assert (got.protocol, got.stdout) == ("v3.channel.k8s.io", b"x\n"), got
    assert b"exit" in got.error and b"5" in got.error and not got.error.startswith(b"{"), got
    got = asyncio.run(spdy_exec(_url(cri_runtime, cid, ["true"]),
                                protocols=("v2.channel.k8s.io",)))
    assert (got.protocol, got.error) == ("v2.channel.k8s.io", b""), got
    got = asyncio.run(spdy_exec(_url(cri_runtime, cid, ["true"]), protocols=("v9.nope",)))
    assert got.status_code in (400, 403), got
