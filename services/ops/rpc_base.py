"""The XML-RPC methods' shared part: their dependencies (``RpcDeps``), the fault constructor
and the process model every method group reads (the agent's subsystems from the supervisor's
``status``, the pods' containers from the map replicas), as ``RpcBase``."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xmlrpc.client import Fault as XmlFault

from podvisor.ipc.clock import SYSTEM_CLOCK, Clock
from podvisor.ipc.control import (
    AGENT_FAULTS,
    ControlClient,
    ControlError,
    ControlFault,
    Fault,
    status_rows,
)
from podvisor.services.cri import RuntimeClient
from podvisor.services.ops.procs import AGENT_GROUP, Proc, agent_procs, pod_procs, split_namespec
from podvisor.services.ops.pump import PodMaps

__all__ = ["RpcBase", "RpcDeps", "parse_signal", "rpc_fault"]


def rpc_fault(code: Fault, detail: str = "") -> XmlFault:
    return XmlFault(int(code), f"{code.name}: {detail}" if detail else code.name)


@dataclass
class RpcDeps:
    """What the methods use; tests replace the parts."""

    control: ControlClient
    maps: Callable[[], PodMaps]
    changed: threading.Condition  # notified when the maps move
    cri: Callable[[], RuntimeClient]
    logs_dir: Path
    runtime_dir: Path | None  # the embedded runtime's state dir (container pids), else None
    identification: str
    self_name: str = "ops"  # this process: group stops leave it alone
    clock: Clock = SYSTEM_CLOCK  # the process's one clock
    # the validated ``supervision.processes`` specs (``getAllConfigInfo``'s events flags)
    process_specs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def parse_signal(raw: object) -> signal.Signals:
    text = str(raw).strip().upper()
    try:
        if text.isdigit():
            return signal.Signals(int(text))
        return signal.Signals[text if text.startswith("SIG") else f"SIG{text}"]
    except (KeyError, ValueError):
        raise rpc_fault(Fault.BAD_SIGNAL, str(raw)) from None


class RpcBase:
    """The process model of the method groups (``OpsRpc`` composes them)."""

    def __init__(self, deps: RpcDeps) -> None:
        self.d = deps

    # -- model --------------------------------------------------------------------------
    def _agent(self) -> list[Proc]:
        rows = status_rows(self._control("status"))
        return agent_procs(rows, self.d.clock.wall(), self.d.logs_dir)

    def _pods(self) -> list[Proc]:
        m = self.d.maps()
        return pod_procs(m.desired, m.statuses, m.pleg, self.d.runtime_dir, m.pods)

    def _all(self) -> list[Proc]:
        pods = sorted(self._pods(), key=lambda p: (p.group, p.name))
        return sorted(self._agent(), key=lambda p: p.name) + pods

    def _find(self, namespec: str) -> tuple[str, Proc | None]:
        group, name = split_namespec(str(namespec))
        procs = self._agent() if group == AGENT_GROUP else self._pods()
        if not any(p.group == group for p in procs):
            raise rpc_fault(Fault.BAD_NAME, str(namespec))
        if name is None:
            return group, None
        for p in procs:
            if p.group == group and p.name == name:
                return group, p
        raise rpc_fault(Fault.BAD_NAME, str(namespec))

    def _one(self, namespec: str) -> Proc:
        _, proc = self._find(namespec)
        if proc is None:
            raise rpc_fault(Fault.BAD_NAME, str(namespec))
        return proc

    def _control(self, command: str, **args: Any) -> Any:
        try:
            return self.d.control.call(command, **args)
        except ControlFault as err:  # podvisor's own codes are not supervisord's: FAILED
            code = Fault.FAILED if err.fault in AGENT_FAULTS else err.fault
            raise rpc_fault(code, err.message) from None
        except ControlError as err:  # nothing answered
            raise rpc_fault(Fault.FAILED, str(err)) from None

    def find_proc(self, namespec: str) -> Proc:
        """The one process ``namespec`` names (BAD_NAME fault otherwise); public for the other
        routes of the ops port (log tails)."""
        return self._one(namespec)

    def _each(self, procs: list[Proc], action: Callable[[Proc], object]) -> list[dict[str, Any]]:
        out = []
        for p in procs:
            try:
                action(p)
            except XmlFault as fault:
                text = fault.faultString.split(":", 1)[0]
                out.append({"name": p.name, "group": p.group, "status": fault.faultCode,
                            "description": text})
            else:
                out.append({"name": p.name, "group": p.group, "status": int(Fault.SUCCESS),
                            "description": "OK"})
        return out
