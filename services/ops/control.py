"""A client of the supervisor's control endpoint, over its documented wire form only.

Request: msgpack ``{"command": str, "args": map}`` on a DEALER to ``run/control.sock``; reply
``{"ok": true, "result": ...}`` or ``{"ok": false, "fault": {"code", "name", "message"}}``
(docs/ARCHITECTURE.md, "Control endpoint"). The control faults carry supervisord's numbers, so
they pass through to XML-RPC unchanged. One DEALER per call: safe from any thread.
"""

from __future__ import annotations

from typing import Any

import msgpack
import zmq

__all__ = ["ControlError", "ControlLink"]

FAILED, TIMEOUT = 30, 100


class ControlError(Exception):
    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.code, self.name, self.message = code, name, message


class ControlLink:
    def __init__(self, zctx: zmq.Context[zmq.Socket[bytes]], endpoint: str,
                 timeout: float = 30.0) -> None:
        self._zctx, self.endpoint, self.timeout = zctx, endpoint, timeout

    def call(self, command: str, timeout: float | None = None, **args: Any) -> Any:
        wait = self.timeout if timeout is None else timeout
        sock = self._zctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(self.endpoint)
            sock.send(msgpack.packb({"command": command, "args": args}))
            if not sock.poll(int(wait * 1000)):
                raise ControlError(TIMEOUT, "TIMEOUT", f"no answer from the agent in {wait:g}s")
            reply = msgpack.unpackb(sock.recv_multipart()[-1])
        finally:
            sock.close(linger=0)
        if not isinstance(reply, dict):
            raise ControlError(FAILED, "FAILED", "malformed reply from the agent")
        if reply.get("ok"):
            return reply.get("result")
        fault = reply.get("fault") or {}
        raise ControlError(int(fault.get("code", FAILED)), str(fault.get("name", "FAILED")),
                           str(fault.get("message", "")))
