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
