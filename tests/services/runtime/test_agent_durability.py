"""kill -9 of the whole agent (supervisor + its supervised embedded runtime): containers keep
running and the next agent's runtime re-adopts them with the same IDs, pids and start times."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError, RuntimeClient, new_runtime_client
from tests.conftest import process_gone

RUNTIME = {"runtime": {"module": "podvisor.services.runtime.main"}}


def _client_up(socket: Path, poll: Any) -> RuntimeClient:
    client = new_runtime_client(f"unix://{socket}", timeout=5.0)

    def up() -> bool:
        try:
            return client.version().runtime_api_version == "v1"
        except CriError:
            return False
    poll(up, 30.0, "the supervised runtime to serve CRI")
    return client


def test_kill9_agent_keeps_containers_and_next_agent_readopts(agent: Any, poll: Any) -> None:
    first = agent(processes=RUNTIME)
    runtime_pid = first.wait_state("runtime", "RUNNING")["pid"]
    client = _client_up(first.paths.cri_socket, poll)
    try:
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name="p", namespace="d", uid="agent-kill9"),
            log_directory=str(first.root / "podlogs"))
        sid = client.run_pod_sandbox(config)
        cid = client.create_container(sid, pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="c"), image=pb.ImageSpec(image="host"),
            command=["sleep", "1000"], log_path="c.log"), config)
        client.start_container(cid)
        before = client.container_status(cid)
        state = first.paths.runtime_dir / "containers" / f"{cid}.started.json"
        container = psutil.Process(json.loads(state.read_text())["pid"])

        first.proc.kill()
        first.proc.wait()
        poll(lambda: process_gone(runtime_pid), message="the runtime to follow its supervisor down")
        assert container.is_running()

        # A new agent on the same rootDir.
        agent(config=dict(first.config))
        client.close()
        client = _client_up(first.paths.cri_socket, poll)
        after = client.container_status(cid)
        assert after.state == pb.CONTAINER_RUNNING
        assert after.started_at == before.started_at
        assert json.loads(state.read_text())["pid"] == container.pid
        assert container.is_running()
    finally:
        for sb in client.list_pod_sandbox():
            client.stop_pod_sandbox(sb.id)
            client.remove_pod_sandbox(sb.id)
        client.close()
