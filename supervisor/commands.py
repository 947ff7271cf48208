"""Control commands: one class per command, `validate()` then `execute()` (circus style).

Each docstring gives the wire form: a msgpack map `{"command": NAME, "args": {...}}` in, and
`{"ok": true, "result": ...}` or `{"ok": false, "fault": {"code", "name", "message"}}` out.
`execute()` returns the result, or a `Pending` whose `done()` the loop polls (replies are
deferred, the loop never blocks). Faults are raised as `ControlFault`.

Adding a command: write a class here (or anywhere) and pass an instance in
`Dependencies.commands` (see `app.py`); `default_commands()` is the built-in set. Commands answered
by another process (`pods`, `logs`, `events`) return a `Pending` that polls a socket to that
process; until one exists they answer NOT_AVAILABLE (`Unavailable`).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from podvisor.ipc.control import ControlFault, Fault, ProcessRow, ProcessState
from podvisor.supervisor.core import Supervisor

__all__ = ["Command", "CommandContext", "Pending", "default_commands", "parse_signal"]

S = ProcessState
Args = Mapping[str, Any]


class CommandContext(Protocol):
    """What a command may use: the supervisor, the logs folder, shutdown and reload."""

    sup: Supervisor
    logs_dir: Path
    started_at: float  # wall clock

    def request_shutdown(self, pods: bool) -> None: ...
    def request_node_shutdown(self) -> None: ...
    def reload(self) -> list[str]: ...


@dataclass
class Pending:
    """A deferred reply: sent as `result()` once `done()` holds, or TIMEOUT after `timeout` s."""

    done: Callable[[], bool]
    result: Callable[[], Any]
    timeout: float


class Command:
    name: ClassVar[str] = ""

    def validate(self, args: Args) -> None:
        """Check argument types and values; raise `ControlFault(Fault.BAD_ARGUMENTS, ...)`."""

    def execute(self, ctx: CommandContext, args: Args) -> Any:
        raise NotImplementedError


def _need_name(args: Args) -> None:
    if not isinstance(args.get("name"), str) or not args["name"]:
        raise ControlFault(Fault.BAD_ARGUMENTS, "'name' (a process name) is required")


def _proc_row(ctx: CommandContext, name: str) -> ProcessRow:
    proc = ctx.sup.procs.get(name)
    if proc is None:
        raise ControlFault(Fault.BAD_NAME, f"no process named {name!r}")
    return proc.status(ctx.sup.d.clock(), ctx.sup.d.wall())


def _known(ctx: CommandContext, name: str) -> None:
    if name not in ctx.sup.procs:
        raise ControlFault(Fault.BAD_NAME, f"no process named {name!r}")


def _not_shutting_down(ctx: CommandContext) -> None:
    if ctx.sup.shutting_down:
        raise ControlFault(Fault.SHUTDOWN_STATE, "the agent is shutting down")


def _started_result(ctx: CommandContext, name: str) -> Callable[[], Any]:
    def result() -> Any:
        row = _proc_row(ctx, name)
        if row.state != S.RUNNING:
            why = row.last_exit.reason if row.last_exit is not None else row.reason
            raise ControlFault(Fault.ABNORMAL_TERMINATION, f"{name} is {row.state.name}: {why}")
        return row.to_wire()
    return result


def _state_is_not(ctx: CommandContext, name: str, *states: ProcessState) -> Callable[[], bool]:
    def done() -> bool:
        proc = ctx.sup.procs.get(name)
        return proc is None or proc.state not in states
    return done


class Status(Command):
    """`{"command": "status", "args": {"name"?: str}}` -> `{"agent": {...}, "processes": [row]}`;
    row: `ProcessRow.to_wire()` (name, state, pid, restarts, uptime, heartbeatAge,
    heartbeatLate, since, module, enabled, reason, lastExit {code, signal, signame, reason, time,
    ranFor}; see docs/ARCHITECTURE.md)."""

    name = "status"

    def execute(self, ctx: CommandContext, args: Args) -> Any:
        now, wall = ctx.sup.d.clock(), ctx.sup.d.wall()
        rows = [p.status(now, wall) for p in ctx.sup.procs.values()]
        if isinstance(args.get("name"), str):
            rows = [_proc_row(ctx, args["name"])]
        agent = {"startedAt": ctx.started_at, "shuttingDown": ctx.sup.shutting_down}
        return {"agent": agent, "processes": [row.to_wire() for row in rows]}


class Start(Command):
    """`{"command": "start", "args": {"name": str}}` -> the process row once RUNNING.
    Faults: BAD_NAME, ALREADY_STARTED, SHUTDOWN_STATE, ABNORMAL_TERMINATION."""

    name = "start"

    def validate(self, args: Args) -> None:
        _need_name(args)

    def execute(self, ctx: CommandContext, args: Args) -> Any:
        name = args["name"]
        _known(ctx, name)
        _not_shutting_down(ctx)
        proc = ctx.sup.procs[name]
        if proc.state not in (S.STOPPED, S.EXITED, S.BACKOFF, S.FATAL):
            raise ControlFault(Fault.ALREADY_STARTED, f"{name} is {proc.state.name}")
        ctx.sup.start(name)
        return Pending(_state_is_not(ctx, name, S.STARTING), _started_result(ctx, name),
                       proc.spec.heartbeat_timeout + 5)


class Stop(Command):
    """`{"command": "stop", "args": {"name": str}}` -> the row once it no longer runs (it stays
    STOPPED: no restart). Faults: BAD_NAME, NOT_RUNNING (already STOPPED)."""

    name = "stop"

    def validate(self, args: Args) -> None:
        _need_name(args)

    def execute(self, ctx: CommandContext, args: Args) -> Any:
        name = args["name"]
        _known(ctx, name)
        proc = ctx.sup.procs[name]
        if proc.state == S.STOPPED:
            raise ControlFault(Fault.NOT_RUNNING, f"{name} is not running")
        ctx.sup.stop(name)
        return Pending(_state_is_not(ctx, name, S.STOPPING, S.STARTING, S.RUNNING),
                       lambda: _proc_row(ctx, name).to_wire(), proc.spec.stop_timeout + 5)


class Restart(Command):
    """`{"command": "restart", "args": {"name": str}}` -> the row once RUNNING again.
    Faults: BAD_NAME, SHUTDOWN_STATE, ABNORMAL_TERMINATION."""

    name = "restart"

    def validate(self, args: Args) -> None:
        _need_name(args)

    def execute(self, ctx: CommandContext, args: Args) -> Any:
        name = args["name"]
        _known(ctx, name)
        _not_shutting_down(ctx)
        proc = ctx.sup.procs[name]
        ctx.sup.restart(name)
        return Pending(_state_is_not(ctx, name, S.STOPPING, S.STARTING),
                       _started_result(ctx, name),
                       proc.spec.stop_timeout + proc.spec.heartbeat_timeout + 5)


def parse_signal(raw: object) -> signal.Signals:
    """`9`, `"9"`, `"KILL"`, `"SIGKILL"`, `"kill"` -> `signal.SIGKILL` (ValueError otherwise)."""
    if isinstance(raw, bool):
        raise ValueError(f"bad signal {raw!r}")
    if isinstance(raw, int) or (isinstance(raw, str) and raw.strip().isdigit()):
        return signal.Signals(int(raw))
    if isinstance(raw, str):
        name = raw.strip().upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        if name in signal.Signals.__members__:
            return signal.Signals[name]
    raise ValueError(f"bad signal {raw!r}")


class Kill(Command):
    """`{"command": "kill", "args": {"name": str, "signal": str|int}}` -> the row. Delivers
    exactly that signal (fault injection). Faults: BAD_NAME, BAD_SIGNAL, NOT_RUNNING."""

    name = "kill"

    def validate(self, args: Args) -> None:
        _need_name(args)
        try:
            parse_signal(args.get("signal", "KILL"))
        except ValueError as exc:
            raise ControlFault(Fault.BAD_SIGNAL, str(exc)) from None

    def execute(self, ctx: CommandContext, args: Args) -> Any:
        name = args["name"]
        _known(ctx, name)
        try:
            ctx.sup.kill(name, parse_signal(args.get("signal", "KILL")))
        except ProcessLookupError as exc:
            raise ControlFault(Fault.NOT_RUNNING, str(exc)) from None
        return _proc_row(ctx, name).to_wire()


def tail_lines(path: Path, count: int, max_bytes: int = 1 << 20) -> list[str]:
    """The last `count` lines of `path`, reading at most `max_bytes` from its end."""
    with path.open("rb") as src:
        src.seek(0, 2)
        size = src.tell()
        src.seek(max(0, size - max_bytes))
        data = src.read()
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-count:] if count > 0 else []


class Tail(Command):
    """`{"command": "tail", "args": {"name": str, "lines"?: int (default 20)}}` ->
    `{"name", "file", "lines": [str]}` from `logs/<name>.log` (`supervisor` is the agent's own).
    Faults: BAD_NAME, NO_FILE."""

    name = "tail"

    def validate(self, args: Args) -> None:
        _need_name(args)
        lines = args.get("lines", 20)
        if isinstance(lines, bool) or not isinstance(lines, int) or not 0 <= lines <= 100_000:
            raise ControlFault(Fault.BAD_ARGUMENTS, "'lines' must be an integer 0..100000")

    def execute(self, ctx: CommandContext, args: Args) -> Any:
        name = args["name"]
        if name != "supervisor":
            _known(ctx, name)
        path = ctx.logs_dir / f"{name}.log"
        try:
            lines = tail_lines(path, int(args.get("lines", 20)))
        except FileNotFoundError:
            raise ControlFault(Fault.NO_FILE, f"no log file {path}") from None
        return {"name": name, "file": str(path), "lines": lines}


class Shutdown(Command):
    """`{"command": "shutdown", "args": {"pods"?: bool, "node"?: bool}}` -> `{"shutdown":
    true}`; the agent then stops its processes (in reverse start order) and exits 0. `pods`
    asks syncloop to stop every pod first (`StopAllPods`); `node` is a graceful node shutdown
    first (`NodeShutdown` to the `nodeshutdown` process: Node NotReady, pods Failed in priority
    order). Faults: NOT_AVAILABLE (`node` while graceful node shutdown is off)."""

    name = "shutdown"

    def validate(self, args: Args) -> None:
        for key in ("pods", "node"):
            if not isinstance(args.get(key, False), bool):
                raise ControlFault(Fault.BAD_ARGUMENTS, f"'{key}' must be a boolean")
        if args.get("pods") and args.get("node"):
            raise ControlFault(Fault.BAD_ARGUMENTS, "'pods' and 'node' exclude each other")

    def execute(self, ctx: CommandContext, args: Args) -> Any:
        if args.get("node"):
            ctx.request_node_shutdown()
        else:
            ctx.request_shutdown(bool(args.get("pods", False)))
        return {"shutdown": True}


class Reload(Command):
    """`{"command": "reload", "args": {}}` -> `{"changes": [str]}`, like SIGHUP: re-read the
    config file and apply it. Faults: CANT_REREAD (the file is invalid; nothing changes)."""

    name = "reload"

    def execute(self, ctx: CommandContext, args: Args) -> Any:
        _not_shutting_down(ctx)
        return {"changes": ctx.reload()}


class Events(Command):
    """`{"command": "events", "args": {"limit"?: int, "pod"?: str}}` -> a Kubernetes
    `EventList` `{"kind": "EventList", "apiVersion": "v1", "items": [{type, reason, message,
    involvedObject {kind, name?, namespace?, uid?, file?|url?, fieldPath?}, source {component},
    count, firstTimestamp, lastTimestamp}]}`, oldest first, at most the last `limit`; `pod`
    keeps the events of pods with that name (`name` or `namespace/name`). Kept by the
    supervisor (the last 1000, identical events counted), persisted in `state/events.jsonl`."""

    name = "events"

    def validate(self, args: Args) -> None:
        limit = args.get("limit")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or not 0 <= limit <= 100_000):
            raise ControlFault(Fault.BAD_ARGUMENTS, "'limit' must be an integer 0..100000")
        if not isinstance(args.get("pod", ""), str):
            raise ControlFault(Fault.BAD_ARGUMENTS, "'pod' must be a string")

    def execute(self, ctx: CommandContext, args: Args) -> Any:
        store = getattr(ctx, "events", None)
        if store is None:
            raise ControlFault(Fault.NOT_AVAILABLE, "this agent keeps no events")
        result: dict[str, Any] = store.event_list()
        if pod := args.get("pod"):
            ns, _, name = pod.rpartition("/")
            result["items"] = [e for e in result["items"]
                               if e["involvedObject"].get("name") == name
                               and (not ns or e["involvedObject"].get("namespace") == ns)]
        if args.get("limit") is not None:
            result["items"] = result["items"][-args["limit"]:] if args["limit"] else []
        return result


class Unavailable(Command):
    """A command another process will answer (`pods`, `logs`, `events`); until then it faults
    NOT_AVAILABLE. Replace it in `Dependencies.commands` with the real one."""

    def __init__(self, name: str) -> None:
        self.name = name  # type: ignore[misc]

    def execute(self, ctx: CommandContext, args: Args) -> Any:
        raise ControlFault(Fault.NOT_AVAILABLE, f"no process answers {self.name!r} yet")


def default_commands() -> dict[str, Command]:
    # the fault commands build on this module's base (imported here: no import cycle)
    from podvisor.supervisor.faultcommands import FaultClear, FaultInject, FaultList

    cmds: list[Command] = [Status(), Start(), Stop(), Restart(), Kill(), Tail(), Shutdown(),
                           Reload(), Unavailable("pods"), Unavailable("logs"), Events(),
                           FaultInject(), FaultList(), FaultClear()]
    return {c.name: c for c in cmds}
