"""The control endpoint: a ZeroMQ ROUTER at `paths.control`, msgpack request/reply.

A request is one frame (after the routing frames a DEALER or REQ adds): a msgpack map
`{"command": str, "args": map}`; the reply is `{"ok": true, "result": ...}` or
`{"ok": false, "fault": {"code": int, "name": str, "message": str}}` (the protocol, its codec
and its one client: `podvisor.ipc.control`). `handle()` is the single boundary where exceptions
become numbered faults; nothing a client sends can crash the agent. Runs on the supervisor's
loop thread (the socket is polled by the loop).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import zmq

from podvisor.common.logs import EventLog
from podvisor.ipc.control import ControlFault, Fault, decode_request, encode_reply
from podvisor.supervisor.commands import Command, CommandContext, Pending

__all__ = ["ControlServer"]


def _fault(fault: Fault, message: str) -> dict[str, Any]:
    return {"ok": False, "fault": ControlFault(fault, message).to_wire()}


@dataclass
class _Waiting:
    route: list[bytes]
    pending: Pending
    deadline: float


class ControlServer:
    def __init__(
        self,
        zctx: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        commands: Mapping[str, Command],
        ctx: CommandContext,
        log: EventLog,
    ) -> None:
        self.commands = dict(commands)
        self._ctx = ctx
        self._log = log
        self._waiting: list[_Waiting] = []
        self.socket = zctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.socket.bind(endpoint)

    def handle(self, data: bytes) -> dict[str, Any] | Pending:
        """Run one request. The only place exceptions become faults."""
        name = "?"
        try:
            name, args = decode_request(data)
            command = self.commands.get(name)
            if command is None:
                raise ControlFault(Fault.UNKNOWN_METHOD, f"unknown command {name!r}")
            command.validate(args)
            result = command.execute(self._ctx, args)
            if isinstance(result, Pending):
                return result
            return {"ok": True, "result": result}
        except ControlFault as exc:
            return {"ok": False, "fault": exc.to_wire()}
        except Exception as exc:
            self._log.exception("control.failed", command=name)
            return _fault(Fault.FAILED, f"{type(exc).__name__}: {exc}")

    def serve(self, now: float) -> None:
        """Answer every queued request (non-blocking)."""
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) < 2:
                continue
            route, data = frames[:-1], frames[-1]
            reply = self.handle(data)
            if isinstance(reply, Pending):
                self._waiting.append(_Waiting(route, reply, now + reply.timeout))
            else:
                self._send(route, reply)

    def _finish(self, pending: Pending) -> dict[str, Any]:
        try:
            return {"ok": True, "result": pending.result()}
        except ControlFault as exc:
            return {"ok": False, "fault": exc.to_wire()}
        except Exception as exc:
            self._log.exception("control.failed", command="pending")
            return _fault(Fault.FAILED, f"{type(exc).__name__}: {exc}")

    def check_pending(self, now: float) -> None:
        """Send the replies whose condition now holds or whose time ran out."""
        still: list[_Waiting] = []
        for w in self._waiting:
            try:
                done = w.pending.done()
            except Exception:
                self._log.exception("control.failed", command="pending")
                done = True
            if done:
                self._send(w.route, self._finish(w.pending))
            elif now >= w.deadline:
                self._send(w.route, _fault(Fault.TIMEOUT, "timed out waiting for the result"))
            else:
                still.append(w)
        self._waiting = still

    def next_deadline(self) -> float | None:
        return min((w.deadline for w in self._waiting), default=None)

    @property
    def has_pending(self) -> bool:
        return bool(self._waiting)

    def _send(self, route: list[bytes], reply: Mapping[str, Any]) -> None:
        try:
            self.socket.send_multipart([*route, encode_reply(reply)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self._log.warning("control.reply_dropped", error=str(exc))

    def close(self) -> None:
        self.socket.close(linger=0)
