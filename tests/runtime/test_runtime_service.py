"""The supervised entry ``podvisor.services.runtime.main.run(ctx)``: serves on
``paths.cri_socket``, heartbeats while serving, returns when ``ctx.stop`` is set."""

from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cri_api.v1 import api_pb2 as pb

from podvisor.ipc.paths import RunPaths
from podvisor.services.cri import CriError, new_runtime_client
from podvisor.services.runtime.jsonlog import JsonLogger
from podvisor.services.runtime.main import run


@dataclass
class FakeCtx:
    paths: RunPaths
    log: Any = field(default_factory=lambda: JsonLogger("runtime"))
    stop: threading.Event = field(default_factory=threading.Event)
    beats: int = 0

    def heartbeat(self) -> None:
        self.beats += 1


def test_run_serves_heartbeats_and_stops(poll: Any) -> None:
    root = Path(tempfile.mkdtemp(prefix="pvsvc", dir="/tmp"))
    paths = RunPaths(root)
    paths.ensure()
    ctx = FakeCtx(paths)
    thread = threading.Thread(target=run, args=(ctx,))
    thread.start()
    client = new_runtime_client(f"unix://{paths.cri_socket}", timeout=5.0)
    try:
        def up() -> bool:
            try:
                return client.version().runtime_api_version == "v1"
            except CriError:
                return False
        poll(up, message="runtime to serve on paths.cri_socket")
        poll(lambda: ctx.beats >= 2, message="heartbeats")
        sid = client.run_pod_sandbox(pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name="p", namespace="n", uid="u")))
        assert f'"id":"{sid}"' in (paths.runtime_dir / "meta.jsonl").read_text()
    finally:
        ctx.stop.set()
        thread.join(15)
        client.close()
        shutil.rmtree(root, ignore_errors=True)
    assert not thread.is_alive()
    assert not paths.cri_socket.exists()
