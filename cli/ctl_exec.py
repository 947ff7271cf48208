"""`podvisorctl exec POD [-n NAMESPACE] [-c CONTAINER] [-i] [-t] -- CMD...`: run a command in a
running container, as `kubectl exec`.

It asks the agent's runtime (the embedded runtime's socket under `run/`, or the configured
`runtimeEndpoint`, e.g. containerd) for a CRI `Exec` URL, as `top` and `images` do, and speaks
the WebSocket channel protocol (`v5.channel.k8s.io`, else `v4.channel.k8s.io`) to it: the same
streaming server the main port's `/exec` relays to, with no main-port credentials needed (the
caller already has the rootDir). stdout and stderr are copied to this process's; with `-i`
this process's stdin is sent and its end closes the command's input (v5 only; containerd
speaks v4, where the command's input stays open). The exit code is the command's.
`-t`: the command gets a terminal (its stderr is the terminal too); when this process's stdin
is a terminal it is put in raw mode for the session (restored after) and its size is sent at
the start and on every SIGWINCH (the resize channel). POD is the pod's name, or the static
pod's short name (`POD-<node>`). Exit 2 when the pod, the container or the runtime cannot be found.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import termios
import threading
from pathlib import Path
from typing import Any

from podvisor.common.config import runtime_endpoint_of
from podvisor.common.endpoint import cri_endpoint
from podvisor.common.labels import CONTAINER_NAME, POD_NAME, POD_NAMESPACE
from podvisor.ipc.paths import RunPaths

__all__ = ["main_exec"]

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")


def _pick(containers: list[Any], pod: str, container: str | None) -> tuple[Any | None, str]:
    """(the container to exec in, or None and why)."""
    exact = [c for c in containers if c.labels.get(POD_NAME) == pod]
    mine = exact or [c for c in containers
                     if c.labels.get(POD_NAME, "").startswith(pod + "-")]
    pods = {c.labels.get(POD_NAME) for c in mine}
    if not mine:
        return None, f"no running pod {pod}"
    if len(pods) > 1:
        return None, f"pod {pod} is ambiguous: {', '.join(sorted(map(str, pods)))}"
    names = sorted({c.labels.get(CONTAINER_NAME, "") for c in mine})
    if container is None:
        if len(names) > 1:
            return None, (f"pod {pod} has several containers ({', '.join(names)}): "
                          "choose one with -c")
        container = names[0]
    found = [c for c in mine if c.labels.get(CONTAINER_NAME) == container]
    if not found:
        return None, f"pod {pod} has no running container {container} ({', '.join(names)})"
    return max(found, key=lambda c: c.created_at), ""


def main_exec(root_dir: str, pod: str, namespace: str, container: str | None, stdin: bool,
              tty: bool, cmd: list[str], timeout: float) -> int:
    from cri_api.v1 import api_pb2 as pb

    from podvisor.services.cri import CriError, new_runtime_client

    if not cmd:
        print("podvisorctl: exec needs a command: exec POD -- CMD...", file=sys.stderr)
        return 2
    paths = RunPaths(Path(root_dir))
    endpoint = runtime_endpoint_of(paths.config_json)
    cri = new_runtime_client(cri_endpoint(endpoint, paths.cri_socket), timeout=timeout)
    try:
        running = cri.list_containers(pb.ContainerFilter(
            state=pb.ContainerStateValue(state=pb.CONTAINER_RUNNING),
            label_selector={POD_NAMESPACE: namespace}))
        target, why = _pick(list(running), pod, container)
        if target is None:
            print(f"podvisorctl: {why} in namespace {namespace}", file=sys.stderr)
            return 2
        url = cri.exec(pb.ExecRequest(container_id=target.id, cmd=cmd, stdin=stdin,
                                      stdout=True, stderr=not tty, tty=tty))
    except CriError as exc:
        print(f"podvisorctl: the runtime at {endpoint} refused exec: {exc}", file=sys.stderr)
        return 2
    finally:
        cri.close()
    raw = tty and stdin and os.isatty(sys.stdin.fileno())
    saved = termios.tcgetattr(sys.stdin.fileno()) if raw else None
    try:
        if raw:
            import tty as tty_mode
            tty_mode.setraw(sys.stdin.fileno())
        return asyncio.run(_stream(url, stdin, tty))
    finally:
        if saved is not None:
            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)


def _terminal_size() -> bytes | None:
    for stream in (sys.stdin, sys.stdout):
        try:
            size = os.get_terminal_size(stream.fileno())
        except (OSError, ValueError):
            continue
        return b"\x04" + json.dumps({"Width": size.columns, "Height": size.lines}).encode()
    return None


async def _stream(url: str, stdin: bool, tty: bool = False) -> int:
    import aiohttp

    status: dict[str, Any] = {}
    origin = url.split("/exec/")[0]
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as session, session.ws_connect(
            url, protocols=PROTOCOLS, headers={"Origin": origin}, max_msg_size=0) as ws:
        feeder = asyncio.ensure_future(_feed(ws, ws.protocol == PROTOCOLS[0])) if stdin \
            else None
        resizes: set[asyncio.Future[None]] = set()

        def resize() -> None:
            message = _terminal_size()
            if message is not None:
                task = asyncio.ensure_future(ws.send_bytes(message))
                resizes.add(task)
                task.add_done_callback(resizes.discard)
        if tty:
            resize()
            loop.add_signal_handler(signal.SIGWINCH, resize)
        try:
            async for msg in ws:
                if msg.type is not aiohttp.WSMsgType.BINARY or not msg.data:
                    continue
                channel, data = msg.data[0], msg.data[1:]
                if channel in (1, 2):
                    out = sys.stdout.buffer if channel == 1 else sys.stderr.buffer
                    out.write(data)
                    out.flush()
                elif channel == 3:
                    status = json.loads(data)
        finally:
            if tty:
                loop.remove_signal_handler(signal.SIGWINCH)
            if feeder is not None:
                feeder.cancel()
    if status.get("status") == "Success":
        return 0
    details = status.get("details")  # a Kubernetes Status: its details' causes
    causes = details.get("causes", []) if isinstance(details, dict) else []
    for cause in causes:
        if cause.get("reason") == "ExitCode":
            return int(cause.get("message", "1"))
    if status:
        print(f"podvisorctl: exec failed: {status.get('message', status)}", file=sys.stderr)
    else:
        print("podvisorctl: exec: the stream ended without a status", file=sys.stderr)
    return 1


async def _feed(ws: Any, can_close: bool) -> None:
    """This process's stdin to channel 0; its end closes the command's input (v5). Read by a
    daemon thread, so a command that ends before its input does not hold this process."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[bytes] = asyncio.Queue()
    fd = sys.stdin.fileno()

    def read() -> None:
        while True:
            try:
                data = os.read(fd, 32 * 1024)
            except OSError:
                data = b""
            loop.call_soon_threadsafe(chunks.put_nowait, data)
            if not data:
                return

    threading.Thread(target=read, name="exec-stdin", daemon=True).start()
    while data := await chunks.get():
        await ws.send_bytes(b"\x00" + data)
    if can_close:
        await ws.send_bytes(b"\xff\x00")
