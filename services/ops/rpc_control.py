"""``supervisor.*`` process control: start, stop and signal a process, a group or all, with
the container semantics of docs/ARCHITECTURE.md ("The ops port"): a container is stopped through
CRI and its pod's restartPolicy then applies; starting one waits for the kubelet's restart."""

from __future__ import annotations

import os
import signal
from typing import Any

from podvisor.ipc.control import Fault, ProcessState
from podvisor.services.cri import CriError
from podvisor.services.ops.procs import Proc
from podvisor.services.ops.rpc_base import RpcBase, parse_signal, rpc_fault
from podvisor.services.ops.states import RUNNING_STATES

__all__ = ["START_WAIT", "ControlMethods"]

START_WAIT = 60.0  # startProcess on a container waits this long for the kubelet's restart
signal_module = signal  # signalProcess's argument is named ``signal``, as supervisord's


class ControlMethods(RpcBase):
    """startProcess*, stopProcess*, signalProcess*."""

    # -- start / stop / signal ------------------------------------------------------------
    def startProcess(self, name: str, wait: bool = True) -> bool:
        """ Start a process

        @param string name Process name (or ``group:name``, or ``group:*``)
        @param boolean wait Wait for process to be fully started
        @return boolean result     Always true unless error
        """
        group, proc = self._find(name)
        if proc is None:
            self.startProcessGroup(group, wait)
            return True
        if proc.kind == "agent":
            self._control("start", name=proc.name)
            return True
        return self._start_container(proc, wait)

    def _start_container(self, proc: Proc, wait: bool) -> bool:
        if proc.state == ProcessState.RUNNING:
            raise rpc_fault(Fault.ALREADY_STARTED, proc.namespec)
        policy = str(proc.extra.get("restartPolicy"))
        if policy == "Never" or (policy == "OnFailure" and proc.exitstatus == 0
                                 and proc.state == ProcessState.EXITED):
            raise rpc_fault(Fault.FAILED, f"{proc.namespec}: restartPolicy {policy}: the "
                            "kubelet does not start this container again")
        if not wait:
            return True
        deadline = self.d.clock.monotonic() + START_WAIT
        with self.d.changed:
            while True:
                now = self._find_quiet(proc)
                if now is not None and now.state == ProcessState.RUNNING:
                    return True
                left = deadline - self.d.clock.monotonic()
                if left <= 0:
                    why = now.spawnerr if now is not None else "gone"
                    raise rpc_fault(Fault.ABNORMAL_TERMINATION, f"{proc.namespec}: {why}")
                self.d.changed.wait(left)

    def _find_quiet(self, proc: Proc) -> Proc | None:
        for p in self._pods():
            if p.group == proc.group and p.name == proc.name:
                return p
        return None

    def startProcessGroup(self, name: str, wait: bool = True) -> list[dict[str, Any]]:
        """ Start all processes in the group named 'name'

        @param string name     The group name
        @param boolean wait    Wait for each process to be fully started
        @return array result   An array of process status info structs
        """
        self._find(f"{name}:*")
        return self._each([p for p in self._all() if p.group == name
                           and p.state not in RUNNING_STATES],
                          lambda p: self.startProcess(p.namespec, wait))

    def startAllProcesses(self, wait: bool = True) -> list[dict[str, Any]]:
        """ Start all processes listed in the configuration file

        @param boolean wait    Wait for each process to be fully started
        @return array result   An array of process status info structs
        """
        return self._each([p for p in self._all() if p.state not in RUNNING_STATES],
                          lambda p: self.startProcess(p.namespec, wait))

    def stopProcess(self, name: str, wait: bool = True) -> bool:
        """ Stop a process named by name

        @param string name  The name of the process to stop (or 'group:name')
        @param boolean wait        Wait for the process to be fully stopped
        @return boolean result     Always return True unless error
        """
        group, proc = self._find(name)
        if proc is None:
            self.stopProcessGroup(group, wait)
            return True
        if proc.kind == "agent":
            if proc.name == self.d.self_name:
                raise rpc_fault(Fault.FAILED, f"{proc.namespec} serves this connection; stop "
                                "it with podvisorctl or set opsPort: 0")
            self._control("stop", name=proc.name)
            return True
        if proc.state not in (ProcessState.RUNNING, ProcessState.STARTING):
            raise rpc_fault(Fault.NOT_RUNNING, proc.namespec)
        self._cri_stop(proc, int(proc.extra.get("grace", 30)))
        return True

    def _cri_stop(self, proc: Proc, timeout: int) -> None:
        cid = str(proc.extra.get("container_id", ""))
        if not cid:
            raise rpc_fault(Fault.NOT_RUNNING, proc.namespec)
        try:
            self.d.cri().stop_container(cid, timeout)
        except CriError as err:
            raise rpc_fault(Fault.FAILED, f"{proc.namespec}: {err}") from None

    def stopProcessGroup(self, name: str, wait: bool = True) -> list[dict[str, Any]]:
        """ Stop all processes in the process group named 'name'

        @param string name     The group name
        @param boolean wait    Wait for each process to be fully stopped
        @return array result   An array of process status info structs
        """
        self._find(f"{name}:*")
        return self._each(self._stoppable(name), lambda p: self.stopProcess(p.namespec, wait))

    def stopAllProcesses(self, wait: bool = True) -> list[dict[str, Any]]:
        """ Stop all processes in the process list

        @param  boolean wait   Wait for each process to be fully stopped
        @return array result   An array of process status info structs
        """
        return self._each(self._stoppable(None), lambda p: self.stopProcess(p.namespec, wait))

    def _stoppable(self, group: str | None) -> list[Proc]:
        return [p for p in self._all() if (group is None or p.group == group)
                and p.state in (*RUNNING_STATES, ProcessState.STOPPING)
                and not (p.kind == "agent" and p.name == self.d.self_name)]

    def signalProcess(self, name: str, signal: str) -> bool:
        """ Send an arbitrary UNIX signal to the process named by name

        @param string name    Name of the process to signal (or 'group:name')
        @param string signal  Signal to send, as name ('HUP') or number ('1')
        @return boolean
        """
        group, proc = self._find(name)
        sig = parse_signal(signal)
        if proc is None:
            self.signalProcessGroup(group, signal)
            return True
        if proc.kind == "agent":
            self._control("kill", name=proc.name, signal=int(sig))
            return True
        if proc.state != ProcessState.RUNNING:
            raise rpc_fault(Fault.NOT_RUNNING, proc.namespec)
        if proc.pid:
            try:
                os.kill(proc.pid, sig)
            except ProcessLookupError:
                raise rpc_fault(Fault.NOT_RUNNING, proc.namespec) from None
            except PermissionError as err:
                raise rpc_fault(Fault.FAILED, f"{proc.namespec}: {err}") from None
        elif sig == signal_module.SIGKILL:
            self._cri_stop(proc, 0)
        elif sig == signal_module.SIGTERM:
            self._cri_stop(proc, int(proc.extra.get("grace", 30)))
        else:
            raise rpc_fault(Fault.BAD_SIGNAL, f"{sig.name}: this runtime's containers take "
                            "only TERM or KILL (CRI StopContainer)")
        return True

    def signalProcessGroup(self, name: str, signal: str) -> list[dict[str, Any]]:
        """ Send a signal to all processes in the group named 'name'

        @param string name    The group name
        @param string signal  Signal to send, as name ('HUP') or number ('1')
        @return array
        """
        self._find(f"{name}:*")
        parse_signal(signal)
        return self._each([p for p in self._all() if p.group == name
                           and p.state == ProcessState.RUNNING],
                          lambda p: self.signalProcess(p.namespec, signal))

    def signalAllProcesses(self, signal: str) -> list[dict[str, Any]]:
        """ Send a signal to all processes in the process list

        @param string signal  Signal to send, as name ('HUP') or number ('1')
        @return array         An array of process status info structs
        """
        parse_signal(signal)
        return self._each([p for p in self._all() if p.state == ProcessState.RUNNING],
                          lambda p: self.signalProcess(p.namespec, signal))
