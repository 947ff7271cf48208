"""What the streaming server's protocols share: remotecommand's channel numbers, the requests a
CRI call registers (one per token), the final ``metav1.Status`` of an exec, and ``Streamed``,
what a client's input drives (an exec'd command or an attach)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["CHUNK", "CLOSE", "ERROR", "RESIZE", "STDERR", "STDIN", "STDOUT", "AttachRequest",
           "ExecRequest", "Feed", "PortForwardRequest", "Request", "Run", "Send", "Streamed",
           "exit_status", "failure_status"]

STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
CHUNK = 32 * 1024


@dataclass(frozen=True)
class PortForwardRequest:
    sandbox_id: str
    ports: tuple[int, ...]  # from the CRI request; a client may ask for others
    netns: str = ""  # the sandbox's network namespace ('' = the node's)


@dataclass(frozen=True)
class ExecRequest:
    container_id: str
    cmd: tuple[str, ...]
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


@dataclass(frozen=True)
class AttachRequest:
    """Attach to a container's main process: its output as its CRI log file has it, from now
    until the container exits; with ``stdin``, the client's input to the container's stdin or
    terminal through its monitor's attach ``socket`` (monitor.c ``STDIO``)."""
    container_id: str
    log_path: str
    stdout: bool
    stderr: bool
    running: Callable[[], bool] = field(compare=False, repr=False, default=lambda: False)
    stdin: bool = False
    tty: bool = False
    socket: str = ""


Request = ExecRequest | PortForwardRequest | AttachRequest


def exit_status(code: int) -> dict[str, Any]:
    """The ``metav1.Status`` the API server and kubectl read from the error channel."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure",
            "message": f"command terminated with non-zero exit code: exit status {code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


def failure_status(message: str) -> dict[str, Any]:
    return {"metadata": {}, "status": "Failure", "message": message,
            "reason": "InternalError", "code": 500}


class Streamed(Protocol):
    """What a client's input drives: an exec'd command (``stream_pty.Proc``) or an attach
    (``stream_attach.Follower``)."""

    async def write_stdin(self, data: bytes) -> None: ...
    def close_stdin(self) -> None: ...
    def resize(self, size: Any) -> None: ...
    def resize_json(self, data: bytes) -> None: ...
    def kill(self) -> None: ...


# a channel's bytes to the client
Send = Callable[[int, bytes], Awaitable[None]]
# the client's input to the command (or attach) until the client goes away
Feed = Callable[[Streamed], Awaitable[None]]
# the command run (or the attach followed) with a protocol's send and feed: the final status
Run = Callable[[ExecRequest | AttachRequest, Send, Feed], Awaitable[dict[str, Any]]]
