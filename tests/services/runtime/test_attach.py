"""CRI Attach (stdout/stderr of the container's main process) over SPDY with a SPDY client,
on the embedded runtime (which follows the container's CRI log) and on containerd."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError
from tests.services.conftest import runs_processes
from tests.support.spdy_client import spdy_exec


def test_attach_follows_output_until_exit(cri_runtime: Any, tmp_path: Path) -> None:
    runs_processes(cri_runtime, "attach")
    mark = tmp_path / "go"
    script = (f"n=0; while [ ! -e {mark} ]; do n=$((n+1)); echo tick $n; sleep 0.1; done; "
              "echo bye; echo oops >&2; sleep 0.3")
    sid, sconfig = cri_runtime.run("attach")
    config = cri_runtime.container_config("talker", ["sh", "-c", script])
    config.mounts.append(pb.Mount(container_path=str(tmp_path), host_path=str(tmp_path)))
    cid = cri_runtime.client.create_container(sid, config, sconfig)
    cri_runtime.client.start_container(cid)
    url = str(cri_runtime.client.attach(pb.AttachRequest(container_id=cid, stdout=True,
                                                         stderr=True)))
    got = asyncio.run(spdy_exec(url, on_stdout=lambda _: mark.touch()))
    assert got.status_code == 101
    lines = got.stdout.decode().splitlines()
    assert lines[-1] == "bye" and all(li.startswith("tick ") for li in lines[:-1]), lines
    assert got.stderr == b"oops\n"
    assert got.status.get("status", "Success") == "Success", got


def test_attach_refusals(cri_runtime: Any) -> None:
    runs_processes(cri_runtime, "attach")
    if cri_runtime.name != "embedded":
        pytest.skip("the embedded runtime's refusals")
    cid = cri_runtime.start(cri_runtime.run("attachno"), "c", ["sleep", "1000"])
    with pytest.raises(CriError) as info:
        cri_runtime.client.attach(pb.AttachRequest(container_id=cid, stdin=True, stdout=True))
    assert "no stdin" in str(info.value)


def test_stdin_and_tty(cri_runtime: Any, poll: Any) -> None:
    runs_processes(cri_runtime, "attach")
    check_interactive(cri_runtime, poll)


def check_interactive(rt: Any, poll: Any) -> None:
    """CRI's stdin / stdin_once / tty (``kubectl run -it``, ``kubectl attach -it``): an attach
    with stdin reaches the container's stdin, and stdin_once closes it after that attach (cat
    ends); a tty container has a terminal, the client types a line into it and the output
    (the terminal's echo too) is the container's stdout."""
    sid, sconfig = rt.run("interactive")
    config = rt.container_config("cat", ["cat"])
    config.stdin, config.stdin_once = True, True
    cid = rt.client.create_container(sid, config, sconfig)
    rt.client.start_container(cid)
    url = str(rt.client.attach(pb.AttachRequest(container_id=cid, stdin=True, stdout=True,
                                                stderr=True)))
    got = asyncio.run(spdy_exec(url, stdin=b"hello over stdin\n"))
    assert got.stdout == b"hello over stdin\n", got
    status = rt.wait_exited(cid, 30.0)  # stdin_once: EOF after the attach, cat ends
    assert status.exit_code == 0

    config = rt.container_config("term", ["sh", "-c", "[ -t 0 ] && [ -t 1 ] && echo tty-yes; "
                                                      "read line; echo got:$line"])
    config.stdin, config.tty = True, True
    cid = rt.client.create_container(sid, config, sconfig)
    rt.client.start_container(cid)
    path = rt.client.container_status(cid).log_path
    poll(lambda: Path(path).exists() and "tty-yes" in Path(path).read_text(), message="tty")
    url = str(rt.client.attach(pb.AttachRequest(container_id=cid, stdin=True, stdout=True,
                                                tty=True)))
    got = asyncio.run(spdy_exec(url, stdin=b"typed\n", stderr=False, tty=True,
                                resize=(100, 30), close_stdin=False))
    assert b"got:typed" in got.stdout, got  # the shell read the line from its terminal
    assert rt.wait_exited(cid, 30.0).exit_code == 0
