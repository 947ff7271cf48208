"""Client of the control endpoint (used by `podvisorctl`, tests and the HTTP server).

`ControlClient(endpoint).call("status")` returns the result or raises `ControlFault` (the
agent answered with a fault) or `AgentNotRunning` (no socket, a stale socket, or no answer within
the timeout: never a hang). One DEALER socket per call; safe to use from any one thread.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import msgpack
import zmq

from podvisor.ipc.paths import RunPaths
from podvisor.supervisor.faults import ControlFault, Fault

__all__ = ["AgentNotRunning", "ControlClient", "endpoint_for_root"]


class AgentNotRunning(Exception):
    """Nothing answers on the control endpoint."""


def endpoint_for_root(root_dir: str | Path) -> str:
    return RunPaths(Path(root_dir)).control


def _check_ipc(endpoint: str) -> None:
    """Fail fast when an ipc:// socket file is missing or nobody listens on it."""
    if not endpoint.startswith("ipc://"):
        return
    path = endpoint.removeprefix("ipc://")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except FileNotFoundError:
        raise AgentNotRunning(f"the agent is not running (no {path})") from None
    except ConnectionRefusedError:
        raise AgentNotRunning(f"the agent is not running (stale socket {path})") from None
    except PermissionError:
        raise AgentNotRunning(f"permission denied on {path}") from None
    except OSError as exc:
        raise AgentNotRunning(f"cannot connect to {path}: {exc}") from None
    finally:
        probe.close()


class ControlClient:
    def __init__(self, endpoint: str, timeout: float = 5.0,
                 zctx: zmq.Context[zmq.Socket[bytes]] | None = None) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._zctx = zctx or zmq.Context.instance()

    def call(self, command: str, timeout: float | None = None, **args: Any) -> Any:
        """Send one request and wait up to `timeout` seconds for its reply."""
        _check_ipc(self.endpoint)
        wait = self.timeout if timeout is None else timeout
        sock = self._zctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(self.endpoint)
            sock.send(msgpack.packb({"command": command, "args": args}))
            if not sock.poll(int(wait * 1000)):
                raise AgentNotRunning(f"no answer from the agent within {wait:g}s")
            reply = msgpack.unpackb(sock.recv_multipart()[-1])
        finally:
            sock.close(linger=0)
        if not isinstance(reply, dict):
            raise ControlFault(Fault.FAILED, "malformed reply")
        if reply.get("ok"):
            return reply.get("result")
        fault = reply.get("fault") or {}
        try:
            code = Fault(int(fault.get("code", Fault.FAILED)))
        except ValueError:
            code = Fault.FAILED
        raise ControlFault(code, str(fault.get("message", "")))
