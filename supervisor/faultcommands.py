"""The fault control commands (issue 28): `fault-inject`, `fault-list`, `fault-clear`.

The request's fields and their validation are the protocol's (``ipc/faults.py``); the table of
faults in force is the supervisor's (``supervisor/faults.py``, ``Agent.faults``).
"""

from __future__ import annotations

from dataclasses import replace
from subprocess import SubprocessError
from typing import Any

from podvisor.ipc.control import ControlFault, Fault
from podvisor.ipc.faults import (
    API_TARGET,
    POD_PREFIX,
    ROOT_DIR_TARGET,
    FaultSpec,
    FaultSpecError,
    spec_from_args,
)
from podvisor.supervisor.commands import Args, Command, CommandContext, parse_signal
from podvisor.supervisor.faults import FaultTable

__all__ = ["FaultClear", "FaultInject", "FaultList"]


def _table(ctx: CommandContext) -> FaultTable:
    table = getattr(ctx, "faults", None)
    if not isinstance(table, FaultTable):
        raise ControlFault(Fault.NOT_AVAILABLE, "this agent injects no faults")
    return table


def _spec(args: Args) -> FaultSpec:
    try:
        spec = spec_from_args(args)
    except FaultSpecError as exc:
        raise ControlFault(Fault.BAD_ARGUMENTS, str(exc)) from None
    if spec.kind == "kill":
        try:
            spec = replace(spec, signal=parse_signal(spec.signal).name.removeprefix("SIG"))
        except ValueError as exc:
            raise ControlFault(Fault.BAD_SIGNAL, str(exc)) from None
    return spec


class FaultInject(Command):
    """`{"command": "fault-inject", "args": {"kind", "target", ...the kind's fields, "for"?}}`
    (``ipc/faults.py``) -> the fault in force `{"id", "spec", "started", "expires"}`. Faults:
    BAD_ARGUMENTS (the request), BAD_SIGNAL, BAD_NAME (no such process), NOT_RUNNING (kill,
    stop: the process does not run), SHUTDOWN_STATE."""

    name = "fault-inject"

    def validate(self, args: Args) -> None:
        _spec(args)

    def execute(self, ctx: CommandContext, args: Args) -> Any:
        spec = _spec(args)
        if ctx.sup.shutting_down:
            raise ControlFault(Fault.SHUTDOWN_STATE, "the agent is shutting down")
        if spec.target not in ctx.sup.procs and not (
                spec.kind == "api" and spec.target == API_TARGET) and not (
                spec.kind in ("resource", "disk") and spec.target.startswith(POD_PREFIX)) and not (
                spec.kind == "disk" and spec.target == ROOT_DIR_TARGET):
            known = ", ".join(sorted(ctx.sup.procs))
            raise ControlFault(Fault.BAD_NAME, f"no process named {spec.target!r} (the "
                                               f"agent runs {known})")
        try:
            return _table(ctx).inject(spec).to_wire()
        except ProcessLookupError as exc:
            raise ControlFault(Fault.NOT_RUNNING, str(exc)) from None
        except LookupError as exc:  # a pod without a cgroup, or not running
            raise ControlFault(Fault.BAD_NAME, str(exc.args[0])) from None
        except (OSError, SubprocessError) as exc:  # a stress child, a mount that failed
            raise ControlFault(Fault.FAILED, f"cannot apply {spec.kind} fault: {exc}") from None


class FaultList(Command):
    """`{"command": "fault-list", "args": {}}` -> `{"faults": [fault in force]}`, oldest
    first."""

    name = "fault-list"

    def execute(self, ctx: CommandContext, args: Args) -> Any:
        return {"faults": [f.to_wire() for f in _table(ctx).active()]}


class FaultClear(Command):
    """`{"command": "fault-clear", "args": {"id"?: str}}` -> `{"cleared": [fault]}`: that
    fault, or every fault without an id. Faults: BAD_NAME (no fault in force has that id)."""

    name = "fault-clear"

    def validate(self, args: Args) -> None:
        if not isinstance(args.get("id", ""), str):
            raise ControlFault(Fault.BAD_ARGUMENTS, "'id' must be a fault id (f1, f2, ...)")

    def execute(self, ctx: CommandContext, args: Args) -> Any:
        table = _table(ctx)
        fid = args.get("id") or None
        if fid is not None and fid not in {f.id for f in table.active()}:
            raise ControlFault(Fault.BAD_NAME, f"no fault {fid!r} in force")
        return {"cleared": [f.to_wire() for f in table.clear(fid)]}
