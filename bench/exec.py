"""Exec round trip (`echo`): the main port's `/exec` (WebSocket relay and SPDY/3.1 splice,
through CRI Exec and the embedded runtime's streaming server) beside CRI `ExecSync` and beside
CRI `Exec` + the streaming server directly (WebSocket and SPDY); with
PODVISOR_CONTAINERD_ENDPOINT set, also containerd's `ExecSync` and its streaming path (`Exec`
+ WebSocket v4, and SPDY) on a container of its own.

A real `podvisor run` agent (bench/pods_agent.py, embedded runtime, one static pod running
`sleep`), its main port on 127.0.0.1 with a token file. Each figure: K sequential round trips
(request to exit status), p50 and p99. Prints figures, asserts nothing.

    .venv/bin/python bench/exec.py [-k 50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from cri_api.v1 import api_pb2 as pb

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from mainport import free_port, pct  # noqa: E402
from pods_agent import Agent, kill_descendants, poll  # noqa: E402

from podvisor.services.cri import RuntimeClient, new_runtime_client  # noqa: E402
from tests.support.spdy_client import spdy_exec  # noqa: E402

TOKEN = "bench-token"


async def ws_echo(session: aiohttp.ClientSession, url: str, protocol: str,
                  **kw: object) -> bytes:
    out = b""
    async with session.ws_connect(url, protocols=(protocol,), **kw) as ws:  # type: ignore[arg-type]
        async for msg in ws:
            if msg.type is aiohttp.WSMsgType.BINARY and msg.data[:1] == b"\x01":
                out += msg.data[1:]
    return out


async def timed(k: int, once: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    await once()  # warm
    times = []
    for _ in range(k):
        t0 = time.perf_counter()
        await once()
        times.append(time.perf_counter() - t0)
    return pct(times, 0.5), pct(times, 0.99)


def row(name: str, figures: tuple[float, float]) -> None:
    print(f"{name:<52}{figures[0] * 1000:>9.1f}{figures[1] * 1000:>9.1f}")


async def run_cri(k: int, cri: RuntimeClient, cid: str, protocol: str, label: str) -> None:
    loop = asyncio.get_running_loop()
    row(f"{label} ExecSync echo",
        await timed(k, lambda: loop.run_in_executor(
            None, cri.exec_sync, cid, ["echo", "hi"], 10)))
    req = pb.ExecRequest(container_id=cid, cmd=["echo", "hi"], stdout=True, stderr=True)
    async with aiohttp.ClientSession() as session:
        async def direct() -> bytes:
            url = await loop.run_in_executor(None, cri.exec, req)
            return await ws_echo(session, url, protocol,
                                 headers={"Origin": url.split("/exec/")[0]})
        row(f"{label} Exec + streaming server ({protocol[:2]})", await timed(k, direct))

    async def spdy() -> object:
        url = await loop.run_in_executor(None, cri.exec, req)
        return await spdy_exec(url)
    row(f"{label} Exec + streaming server (SPDY v4)", await timed(k, spdy))


async def run(k: int, agent: Agent, port: int) -> None:
    assert agent.cri is not None
    cid = agent.containers("e0")[0].id
    print(f"exec round trip (echo hi), {k} runs each")
    print(f"{'path':<52}{'p50 ms':>9}{'p99 ms':>9}")
    await run_cri(k, agent.cri, cid, "v5.channel.k8s.io", "embedded:")
    ctx = ssl.create_default_context(cafile=str(agent.paths.root / "pki" / "kubelet.crt"))
    url = (f"https://127.0.0.1:{port}/exec/default/e0-{agent_node()}/app"
           "?command=echo&command=hi&stdout=1&stderr=1")
    async with aiohttp.ClientSession() as session:
        row("embedded: main port /exec (HTTPS, WebSocket v5)", await timed(k, lambda: ws_echo(
            session, url, "v5.channel.k8s.io", ssl=ctx,
            headers={"Authorization": f"Bearer {TOKEN}"})))
    row("embedded: main port /exec (HTTPS, SPDY v4 splice)", await timed(k, lambda: spdy_exec(
        url, headers={"Authorization": f"Bearer {TOKEN}"}, ctx=ctx)))
    endpoint = os.environ.get("PODVISOR_CONTAINERD_ENDPOINT")
    if endpoint:
        await run_containerd(k, endpoint)
    else:
        print("containerd: skipped (PODVISOR_CONTAINERD_ENDPOINT not set)")


def agent_node() -> str:
    from pods_agent import NODE
    return str(NODE)


async def run_containerd(k: int, endpoint: str) -> None:
    """A sandbox and a `sleep` container of the bench's own on containerd, removed after."""
    sys.path.insert(0, str(HERE.parent / "tests" / "support"))
    from containerd import containerd_or_skip  # type: ignore[import-not-found]

    handle = containerd_or_skip()
    cri = new_runtime_client(endpoint, timeout=30.0)
    ns = pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER)
    uid = f"bench-exec-{os.getpid()}"
    config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="bench-exec", namespace="bench", uid=uid),
        hostname="", log_directory="/tmp",
        linux=pb.LinuxPodSandboxConfig(
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=ns)))
    sid = cri.run_pod_sandbox(config)
    try:
        cconf = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="app"), image=pb.ImageSpec(image=handle.image),
            command=["sleep", "3600"], log_path="bench-exec.log",
            linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
                namespace_options=ns)))
        cid = cri.create_container(sid, cconf, config)
        cri.start_container(cid)
        await run_cri(k, cri, cid, "v4.channel.k8s.io", "containerd:")
    finally:
        cri.stop_pod_sandbox(sid)
        cri.remove_pod_sandbox(sid)
        cri.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("-k", type=int, default=50, help="round trips per path")
    args = ap.parse_args(argv)
    port = free_port()
    tokens = Path("/tmp") / f"pvbench-exec-tokens-{port}.csv"
    tokens.write_text(f"{TOKEN},bench,1\n", encoding="utf-8")
    agent = Agent(free_port(), {"port": port, "authentication": {"tokenFile": str(tokens)}})
    try:
        agent.wait_ready()
        agent.drop(agent.stage("e0"))
        poll(lambda: len(agent.running_names()) >= 1, 120.0, 0.2, "the pod running")
        asyncio.run(run(args.k, agent, port))
    finally:
        agent.stop()
        tokens.unlink(missing_ok=True)
        kill_descendants()
    return 0


if __name__ == "__main__":
    sys.exit(main())
