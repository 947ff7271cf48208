"""The control protocol: what is said to the supervisor's control endpoint, and its one client.

The one definition, below every caller (``podvisorctl``, chaos, the ops port, the server's
``/metrics``, the tests) and the supervisor that answers (docs/ARCHITECTURE.md, "Control endpoint
and podvisorctl"). The wire: a DEALER sends one msgpack frame, the request
``{"command": str, "args": map}``, to the ROUTER at ``run/control.sock``; the reply is
``{"ok": true, "result": ...}`` or ``{"ok": false, "fault": {"code": int, "name": str,
"message": str}}``. Fault codes are supervisord's ``xmlrpc.Faults`` where one exists, so they pass
through XML-RPC unchanged; process states carry supervisord's names on the wire and its
``ProcessStates`` numbers as values. A ``status`` result is ``{"agent": {...}, "processes":
[row]}``, each row a ``ProcessRow.to_wire()``. Which state may follow which is the supervisor's
business (``supervisor/states.py``), not the protocol's.
"""

from __future__ import annotations

import enum
import signal
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import zmq

from podvisor.ipc.paths import RunPaths

__all__ = [
    "AGENT_FAULTS",
    "MAX_REQUEST_BYTES",
    "AgentNotRunning",
    "ControlClient",
    "ControlError",
    "ControlFault",
    "Fault",
    "LastExit",
    "ProcessRow",
    "ProcessState",
    "decode_request",
    "encode_reply",
    "encode_request",
    "endpoint_for_root",
    "status_rows",
]

MAX_REQUEST_BYTES = 64 * 1024


class Fault(enum.IntEnum):
    """The numbered faults: supervisord's ``xmlrpc.Faults``, plus podvisor's own two past its
    numbers (``AGENT_FAULTS``)."""

    UNKNOWN_METHOD = 1
    INCORRECT_PARAMETERS = 2
    BAD_ARGUMENTS = 3
    SIGNATURE_UNSUPPORTED = 4
    SHUTDOWN_STATE = 6
    BAD_NAME = 10
    BAD_SIGNAL = 11
    NO_FILE = 20
    NOT_EXECUTABLE = 21
    FAILED = 30
    ABNORMAL_TERMINATION = 40
    SPAWN_ERROR = 50
    ALREADY_STARTED = 60
    NOT_RUNNING = 70
    SUCCESS = 80
    ALREADY_ADDED = 90
    STILL_RUNNING = 91
    CANT_REREAD = 92
    TIMEOUT = 100  # a deferred reply's condition did not hold in time
    NOT_AVAILABLE = 110  # the answering process (e.g. for `pods`) is not running


# podvisor's own faults, which supervisord's clients do not know: XML-RPC reports them as FAILED.
AGENT_FAULTS = frozenset({Fault.TIMEOUT, Fault.NOT_AVAILABLE})


class ProcessState(enum.IntEnum):
    """A supervised process's state: supervisord's ``ProcessStates`` (names and numbers). The
    wire carries the name; XML-RPC the number."""

    STOPPED = 0
    STARTING = 10
    RUNNING = 20
    BACKOFF = 30
    STOPPING = 40
    EXITED = 100
    FATAL = 200
    UNKNOWN = 1000

    @classmethod
    def of(cls, name: object) -> ProcessState:
        """The state a wire name says; UNKNOWN for anything else."""
        return cls.__members__.get(str(name), cls.UNKNOWN)


class ControlError(Exception):
    """A control call gave no result: the agent answered with a fault, or nothing answered."""


class ControlFault(ControlError):
    """The agent answered with a fault (or a reply that is not the protocol's: FAILED)."""

    def __init__(self, fault: Fault, message: str) -> None:
        super().__init__(f"{fault.name}: {message}")
        self.fault = fault
        self.message = message

    def to_wire(self) -> dict[str, object]:
        return {"code": int(self.fault), "name": self.fault.name, "message": self.message}

    @classmethod
    def from_wire(cls, raw: object) -> ControlFault:
        """A reply's ``fault`` map; a code this side does not know reads as FAILED."""
        fault = raw if isinstance(raw, Mapping) else {}
        try:
            code = Fault(int(fault.get("code", Fault.FAILED)))
        except (TypeError, ValueError):
            code = Fault.FAILED
        return cls(code, str(fault.get("message", "")))


class AgentNotRunning(ControlError):
    """Nothing answers on the control endpoint (no socket, a stale one, or no reply in time)."""


def _num(raw: object) -> float | None:
    return float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else None


def _int(raw: object) -> int | None:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else None


@dataclass(frozen=True)
class LastExit:
    """How a process's latest incarnation ended. ``time`` is wall-clock epoch seconds,
    ``ran_for`` seconds. Wire: ``{code, signal, signame, reason, time, ranFor}``."""

    code: int | None
    signal: int | None
    reason: str
    time: float
    ran_for: float

    @property
    def signame(self) -> str | None:
        if self.signal is None:
            return None
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return str(self.signal)

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "signal": self.signal, "signame": self.signame,
                "reason": self.reason, "time": self.time, "ranFor": round(self.ran_for, 3)}

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> LastExit:
        return cls(code=_int(raw.get("code")), signal=_int(raw.get("signal")),
                   reason=str(raw.get("reason") or ""), time=_num(raw.get("time")) or 0.0,
                   ran_for=_num(raw.get("ranFor")) or 0.0)


@dataclass(frozen=True)
class ProcessRow:
    """One supervised process in a ``status`` result (the stable ``podvisorctl status --json``
    row). ``uptime`` and ``heartbeat_age`` are seconds, None unless RUNNING; ``since`` is the
    wall-clock time of the latest state change; ``heartbeat_late``: RUNNING without a beat for
    three heartbeat intervals."""

    name: str
    state: ProcessState
    pid: int | None = None
    restarts: int = 0
    uptime: float | None = None
    heartbeat_age: float | None = None
    heartbeat_late: bool = False
    since: float = 0.0
    module: str = ""
    enabled: bool = True
    reason: str = ""
    last_exit: LastExit | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state.name,
            "pid": self.pid,
            "restarts": self.restarts,
            "uptime": self.uptime,
            "heartbeatAge": self.heartbeat_age,
            "heartbeatLate": self.heartbeat_late,
            "since": self.since,
            "module": self.module,
            "enabled": self.enabled,
            "reason": self.reason,
            "lastExit": self.last_exit.to_wire() if self.last_exit is not None else None,
        }

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> ProcessRow:
        """The row a ``status`` result carries; a field missing or of the wrong type takes its
        default (an agent of another version still reads), an unknown state is UNKNOWN."""
        last = raw.get("lastExit")
        return cls(
            name=str(raw.get("name", "")),
            state=ProcessState.of(raw.get("state")),
            pid=_int(raw.get("pid")),
            restarts=_int(raw.get("restarts")) or 0,
            uptime=_num(raw.get("uptime")),
            heartbeat_age=_num(raw.get("heartbeatAge")),
            heartbeat_late=bool(raw.get("heartbeatLate")),
            since=_num(raw.get("since")) or 0.0,
            module=str(raw.get("module") or ""),
            enabled=bool(raw.get("enabled", True)),
            reason=str(raw.get("reason") or ""),
            last_exit=LastExit.from_wire(last) if isinstance(last, Mapping) else None,
        )


def status_rows(result: object) -> list[ProcessRow]:
    """The rows of a ``status`` result (none when it is not one)."""
    rows = result.get("processes") if isinstance(result, Mapping) else None
    if not isinstance(rows, list):
        return []
    return [ProcessRow.from_wire(r) for r in rows if isinstance(r, Mapping)]


# -- the request and the reply ------------------------------------------------------------

def encode_request(command: str, args: Mapping[str, Any]) -> bytes:
    data: bytes = msgpack.packb({"command": command, "args": dict(args)})
    return data


def decode_request(data: bytes) -> tuple[str, Mapping[str, Any]]:
    """(command, args) of a request frame; raises ControlFault INCORRECT_PARAMETERS."""
    if len(data) > MAX_REQUEST_BYTES:
        raise ControlFault(Fault.INCORRECT_PARAMETERS, "request too large")
    try:
        req = msgpack.unpackb(data)
    except Exception:
        raise ControlFault(Fault.INCORRECT_PARAMETERS, "request is not msgpack") from None
    if not isinstance(req, dict) or not isinstance(req.get("command"), str):
        raise ControlFault(Fault.INCORRECT_PARAMETERS, "expected a map with a 'command' string")
    args = req.get("args") or {}
    if not isinstance(args, dict):
        raise ControlFault(Fault.INCORRECT_PARAMETERS, "'args' must be a map")
    return req["command"], args


def encode_reply(reply: Mapping[str, Any]) -> bytes:
    data: bytes = msgpack.packb(reply, default=str)
    return data


def _result_of(data: bytes) -> Any:
    """The result of a reply frame, or the ControlFault it carries."""
    try:
        reply = msgpack.unpackb(data)
    except Exception:
        raise ControlFault(Fault.FAILED, "malformed reply") from None
    if not isinstance(reply, dict):
        raise ControlFault(Fault.FAILED, "malformed reply")
    if reply.get("ok"):
        return reply.get("result")
    raise ControlFault.from_wire(reply.get("fault"))


# -- the client ---------------------------------------------------------------------------

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
    """``ControlClient(endpoint).call("status")`` returns the result, or raises ``ControlFault``
    (the agent answered with a fault) or ``AgentNotRunning`` (no socket, a stale socket, or no
    answer within the timeout: never a hang); both are ``ControlError``s. One DEALER per call:
    safe from any thread."""

    def __init__(self, endpoint: str, timeout: float = 5.0,
                 zctx: zmq.Context[zmq.Socket[bytes]] | None = None) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._zctx = zctx or zmq.Context.instance()

    def call(self, command: str, timeout: float | None = None, **args: Any) -> Any:
        """Send one request and wait up to ``timeout`` seconds for its reply."""
        _check_ipc(self.endpoint)
        wait = self.timeout if timeout is None else timeout
        sock = self._zctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(self.endpoint)
            sock.send(encode_request(command, args))
            if not sock.poll(int(wait * 1000)):
                raise AgentNotRunning(f"no answer from the agent within {wait:g}s")
            data = sock.recv_multipart()[-1]
        finally:
            sock.close(linger=0)
        return _result_of(data)

    def processes(self, timeout: float | None = None) -> list[ProcessRow]:
        """Every supervised process, as the ``status`` command lists them."""
        return status_rows(self.call("status", timeout=timeout))
