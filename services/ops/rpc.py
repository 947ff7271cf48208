"""supervisord's XML-RPC interface (API 3.0) over the agent and its pods.

``OpsRpc`` holds the methods (``supervisor.*``; names, arguments, results and fault codes as in
supervisord's ``rpcinterface.py``); ``new_dispatcher()`` registers them on the standard
library's ``SimpleXMLRPCDispatcher`` with ``system.listMethods``, ``methodHelp``,
``methodSignature`` (read from the ``@param``/``@return`` lines of each docstring, as
supervisord does) and ``multicall``. Methods block (control calls, CRI calls, waits): the HTTP
layer runs each request on a worker thread. Every fault is ``xmlrpc.client.Fault(code,
"NAME: detail")``. The mapping of each method onto subsystems and containers is the table in
docs/ARCHITECTURE.md ("The ops port").
"""

from __future__ import annotations

import inspect
import os
import re
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any
from xmlrpc.client import Fault as XmlFault
from xmlrpc.server import SimpleXMLRPCDispatcher

from podvisor.ipc.clock import SYSTEM_CLOCK, Clock
from podvisor.services.cri import CriError, RuntimeClient
from podvisor.services.ops.control import ControlError, ControlLink
from podvisor.services.ops.logfiles import BadRead, read_file, tail_file, truncate
from podvisor.services.ops.procs import AGENT_GROUP, Proc, agent_procs, pod_procs, split_namespec
from podvisor.services.ops.pump import PodMaps
from podvisor.services.ops.states import RUNNING_STATES, Fault, ProcState, SupervisorState

__all__ = ["API_VERSION", "OpsRpc", "RpcDeps", "new_dispatcher", "rpc_fault"]

API_VERSION = "3.0"
START_WAIT = 60.0  # startProcess on a container waits this long for the kubelet's restart


def rpc_fault(code: Fault, detail: str = "") -> XmlFault:
    return XmlFault(int(code), f"{code.name}: {detail}" if detail else code.name)


@dataclass
class RpcDeps:
    """What the methods use; tests replace the parts."""

    control: ControlLink
    maps: Callable[[], PodMaps]
    changed: threading.Condition  # notified when the maps move
    cri: Callable[[], RuntimeClient]
    logs_dir: Path
    runtime_dir: Path | None  # the embedded runtime's state dir (container pids), else None
    identification: str
    self_name: str = "ops"  # this process: group stops leave it alone
    clock: Clock = SYSTEM_CLOCK  # the process's one clock


def _parse_signal(raw: object) -> signal.Signals:
    text = str(raw).strip().upper()
    try:
        if text.isdigit():
            return signal.Signals(int(text))
        return signal.Signals[text if text.startswith("SIG") else f"SIG{text}"]
    except (KeyError, ValueError):
        raise rpc_fault(Fault.BAD_SIGNAL, str(raw)) from None


class OpsRpc:
    """The ``supervisor.*`` methods (registered under that prefix)."""

    def __init__(self, deps: RpcDeps) -> None:
        self.d = deps

    # -- model --------------------------------------------------------------------------
    def _agent(self) -> list[Proc]:
        rows = self._control("status").get("processes", [])
        return agent_procs(rows, self.d.clock.wall(), self.d.logs_dir)

    def _pods(self) -> list[Proc]:
        m = self.d.maps()
        return pod_procs(m.desired, m.statuses, m.pleg, self.d.runtime_dir)

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
        except ControlError as err:
            try:
                code = Fault(err.code)
            except ValueError:
                code = Fault.FAILED
            raise rpc_fault(code, err.message) from None

    # -- status and identity --------------------------------------------------------------
    def getAPIVersion(self) -> str:
        """ Return the version of the RPC API used by supervisord

        @return string version version id
        """
        return API_VERSION

    getVersion = getAPIVersion  # supervisord's b/c alias (supervisorctl calls it)

    def getSupervisorVersion(self) -> str:
        """ Return the version of the supervisor package in use by supervisord

        @return string version version id
        """
        try:
            return f"podvisor {metadata.version('podvisor')}"
        except metadata.PackageNotFoundError:
            return "podvisor"

    def getIdentification(self) -> str:
        """ Return identifying string of supervisord

        @return string identifier identifying string
        """
        return self.d.identification

    def getState(self) -> dict[str, Any]:
        """ Return current state of supervisord as a struct

        @return struct A struct with keys int statecode, string statename
        """
        agent = self._control("status").get("agent", {})
        state = SupervisorState.SHUTDOWN if agent.get("shuttingDown") else SupervisorState.RUNNING
        return {"statecode": int(state), "statename": state.name}

    def getPID(self) -> int:
        """ Return the PID of supervisord

        @return int PID
        """
        return int(os.environ.get("PODVISOR_SUPERVISOR_PID") or os.getppid())

    def readLog(self, offset: int, length: int) -> str:
        """ Read length bytes from the main log starting at offset

        @param int offset         offset to start reading from.
        @param int length         number of bytes to read from the log.
        @return string result     Bytes of log
        """
        return self._read(str(self.d.logs_dir / "supervisor.log"), offset, length)

    readMainLog = readLog

    def clearLog(self) -> bool:
        """ Clear the main log.

        @return boolean result always returns True unless error
        """
        self._truncate(str(self.d.logs_dir / "supervisor.log"), "supervisor")
        return True

    def shutdown(self) -> bool:
        """ Shut down the supervisor process (the agent; pods keep running)

        @return boolean result always returns True unless error
        """
        self._control("shutdown")
        return True

    def restart(self) -> bool:
        """ Restart the supervisor process (every subsystem of the agent, this one last)

        @return boolean result  always return True unless error
        """
        for proc in self._agent():
            if proc.name != self.d.self_name and proc.state in RUNNING_STATES:
                self._control("restart", name=proc.name)
        return True

    def reloadConfig(self) -> list[list[list[str]]]:
        """ Reload the configuration (as SIGHUP does)

        @return array result  [[added, changed, removed]]
        """
        changed = self._control("reload")
        return [[[], [str(c) for c in changed or []], []]]

    # -- process info ---------------------------------------------------------------------
    def getProcessInfo(self, name: str) -> dict[str, Any]:
        """ Get info about a process named name

        @param string name The name of the process (or 'group:name')
        @return struct result     A structure containing data about the process
        """
        return self._one(name).info(self.d.clock.wall())

    def getAllProcessInfo(self) -> list[dict[str, Any]]:
        """ Get info about all processes

        @return array result  An array of process status results
        """
        now = self.d.clock.wall()
        return [p.info(now) for p in self._all()]

    def getAllConfigInfo(self) -> list[dict[str, Any]]:
        """ Get info about all available process configurations. Each struct
        represents a single process (i.e. groups get flattened).

        @return array result  An array of process config info structs
        """
        out = []
        for p in self._all():
            if p.kind == "agent":
                command = f"python -m {p.extra.get('module', '')}"
            else:
                command = " ".join([str(p.extra.get("image", "")),
                                    *map(str, p.extra.get("command", []))]).strip()
            out.append({
                "autostart": True, "directory": "", "uid": os.getuid(), "command": command,
                "exitcodes": [0], "group": p.group, "group_prio": 999, "inuse": True,
                "killasgroup": p.kind == "container", "name": p.name, "process_prio": 999,
                "redirect_stderr": True, "startretries": 3, "startsecs": 1,
                "stdout_capture_maxbytes": 0, "stdout_events_enabled": False,
                "stdout_logfile": p.logfile, "stdout_logfile_backups": 0,
                "stdout_logfile_maxbytes": 0, "stdout_syslog": False,
                "stopsignal": int(signal.SIGTERM),
                "stopwaitsecs": int(p.extra.get("grace", 5)),
                "stderr_capture_maxbytes": 0, "stderr_events_enabled": False,
                "stderr_logfile": "", "stderr_logfile_backups": 0,
                "stderr_logfile_maxbytes": 0, "stderr_syslog": False, "serverurl": "AUTO",
            })
        return out

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
        if proc.state == ProcState.RUNNING:
            raise rpc_fault(Fault.ALREADY_STARTED, proc.namespec)
        policy = str(proc.extra.get("restartPolicy"))
        if policy == "Never" or (policy == "OnFailure" and proc.exitstatus == 0
                                 and proc.state == ProcState.EXITED):
            raise rpc_fault(Fault.FAILED, f"{proc.namespec}: restartPolicy {policy}: the "
                            "kubelet does not start this container again")
        if not wait:
            return True
        deadline = self.d.clock.monotonic() + START_WAIT
        with self.d.changed:
            while True:
                now = self._find_quiet(proc)
                if now is not None and now.state == ProcState.RUNNING:
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
        if proc.state not in (ProcState.RUNNING, ProcState.STARTING):
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
                and p.state in (*RUNNING_STATES, ProcState.STOPPING)
                and not (p.kind == "agent" and p.name == self.d.self_name)]

    def signalProcess(self, name: str, signal: str) -> bool:
        """ Send an arbitrary UNIX signal to the process named by name

        @param string name    Name of the process to signal (or 'group:name')
        @param string signal  Signal to send, as name ('HUP') or number ('1')
        @return boolean
        """
        group, proc = self._find(name)
        sig = _parse_signal(signal)
        if proc is None:
            self.signalProcessGroup(group, signal)
            return True
        if proc.kind == "agent":
            self._control("kill", name=proc.name, signal=int(sig))
            return True
        if proc.state != ProcState.RUNNING:
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
        _parse_signal(signal)
        return self._each([p for p in self._all() if p.group == name
                           and p.state == ProcState.RUNNING],
                          lambda p: self.signalProcess(p.namespec, signal))

    def signalAllProcesses(self, signal: str) -> list[dict[str, Any]]:
        """ Send a signal to all processes in the process list

        @param string signal  Signal to send, as name ('HUP') or number ('1')
        @return array         An array of process status info structs
        """
        _parse_signal(signal)
        return self._each([p for p in self._all() if p.state == ProcState.RUNNING],
                          lambda p: self.signalProcess(p.namespec, signal))

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

    # -- logs -----------------------------------------------------------------------------
    def _read(self, path: str, offset: int, length: int) -> str:
        if not path or not os.path.exists(path):
            raise rpc_fault(Fault.NO_FILE, path)
        try:
            return read_file(path, int(offset), int(length))
        except BadRead as err:
            raise rpc_fault(Fault[err.args[0]]) from None

    def _truncate(self, path: str, name: str) -> None:
        if not path or not os.path.exists(path):
            raise rpc_fault(Fault.NO_FILE, path)
        try:
            truncate(path)
        except OSError:
            raise rpc_fault(Fault.FAILED, name) from None

    def readProcessStdoutLog(self, name: str, offset: int, length: int) -> str:
        """ Read length bytes from name's stdout log starting at offset

        @param string name        the name of the process (or 'group:name')
        @param int offset         offset to start reading from.
        @param int length         number of bytes to read from the log.
        @return string result     Bytes of log
        """
        return self._read(self._one(name).logfile, offset, length)

    readProcessLog = readProcessStdoutLog

    def readProcessStderrLog(self, name: str, offset: int, length: int) -> str:
        """ Read length bytes from name's stderr log starting at offset (stderr goes to the
        same file as stdout: subsystems log to one file, CRI logs interleave both streams)

        @param string name        the name of the process (or 'group:name')
        @param int offset         offset to start reading from.
        @param int length         number of bytes to read from the log.
        @return string result     Bytes of log
        """
        return self._read(self._one(name).logfile, offset, length)

    def tailProcessStdoutLog(self, name: str, offset: int, length: int) -> list[object]:
        """ Tail the (stdout) log: up to length bytes from offset; when the log grew past
        offset + length, the read moves to its end and overflow is set.

        @param string name         the name of the process (or 'group:name')
        @param int offset          offset to start reading from
        @param int length          maximum number of bytes to return
        @return array result       [string bytes, int offset, bool overflow]
        """
        path = self._one(name).logfile
        if not path or not os.path.exists(path):
            return ["", 0, False]
        return tail_file(path, int(offset), int(length))

    tailProcessLog = tailProcessStdoutLog

    def tailProcessStderrLog(self, name: str, offset: int, length: int) -> list[object]:
        """ Tail the (stderr) log (the same file as stdout).

        @param string name         the name of the process (or 'group:name')
        @param int offset          offset to start reading from
        @param int length          maximum number of bytes to return
        @return array result       [string bytes, int offset, bool overflow]
        """
        return self.tailProcessStdoutLog(name, offset, length)

    def clearProcessLogs(self, name: str) -> bool:
        """ Clear the stdout and stderr logs for the named process

        @param string name   The name of the process (or 'group:name')
        @return boolean result      Always True unless error
        """
        proc = self._one(name)
        self._truncate(proc.logfile, proc.namespec)
        return True

    clearProcessLog = clearProcessLogs

    def clearAllProcessLogs(self) -> list[dict[str, Any]]:
        """ Clear all process log files

        @return array result   An array of process status info structs
        """
        return self._each(self._all(), lambda p: self._truncate(p.logfile, p.namespec))


signal_module = signal

METHODS = (
    "getAPIVersion", "getVersion", "getSupervisorVersion", "getIdentification", "getState",
    "getPID", "readLog", "readMainLog", "clearLog", "shutdown", "restart", "reloadConfig",
    "getProcessInfo", "getAllProcessInfo", "getAllConfigInfo", "startProcess",
    "startProcessGroup", "startAllProcesses", "stopProcess", "stopProcessGroup",
    "stopAllProcesses", "signalProcess", "signalProcessGroup", "signalAllProcesses",
    "readProcessStdoutLog", "readProcessLog", "readProcessStderrLog", "tailProcessStdoutLog",
    "tailProcessLog", "tailProcessStderrLog", "clearProcessLogs", "clearProcessLog",
    "clearAllProcessLogs",
)

_PARAM = re.compile(r"@param\s+(\w+)\s+\w+")
_RETURN = re.compile(r"@return\s+(\w+)\s+")


def signature(fn: Callable[..., Any]) -> list[list[str]]:
    """supervisord's ``methodSignature``: ``[[return type, param types...]]`` from the
    docstring's ``@return``/``@param`` lines."""
    doc = fn.__doc__ or ""
    ret = _RETURN.search(doc)
    if ret is None:
        raise rpc_fault(Fault.SIGNATURE_UNSUPPORTED)
    return [[ret.group(1), *_PARAM.findall(doc)]]


class _Dispatcher(SimpleXMLRPCDispatcher):
    """The one boundary mapping errors to supervisord's faults: an unknown method is
    UNKNOWN_METHOD, wrong arguments INCORRECT_PARAMETERS, anything unexpected FAILED."""

    def _dispatch(self, method: str, params: Any) -> Any:
        fn = self.funcs.get(method)
        if fn is None:
            raise rpc_fault(Fault.UNKNOWN_METHOD)
        try:
            inspect.signature(fn).bind(*params)
        except TypeError:
            raise rpc_fault(Fault.INCORRECT_PARAMETERS) from None
        try:
            return fn(*params)
        except XmlFault:
            raise
        except Exception as err:
            raise rpc_fault(Fault.FAILED, f"{method}: {err!r}") from None


def new_dispatcher(rpc: OpsRpc) -> SimpleXMLRPCDispatcher:
    """The dispatcher of ``/RPC2``: every method, introspection and ``system.multicall``."""
    disp = _Dispatcher(allow_none=False, encoding="utf-8")
    funcs: dict[str, Callable[..., Any]] = {}
    for name in METHODS:
        funcs[f"supervisor.{name}"] = getattr(rpc, name)
    for full, fn in funcs.items():
        disp.register_function(fn, full)
    disp.register_introspection_functions()
    disp.register_multicall_functions()

    def list_methods() -> list[str]:
        """ Return an array listing the available method names

        @return array result  An array of method names available (strings).
        """
        return sorted([*funcs, "system.listMethods", "system.methodHelp",
                       "system.methodSignature", "system.multicall"])

    def method_help(name: Any) -> str:
        """ Return a string showing the method's documentation

        @param string name   The name of the method.
        @return string result The documentation for the method name.
        """
        fn = disp.funcs.get(name)
        if fn is None:
            raise rpc_fault(Fault.SIGNATURE_UNSUPPORTED, name)
        return fn.__doc__ or ""

    def method_signature(name: Any) -> list[list[str]]:
        """ Return an array describing the method signature in the form [rtype, ptype, ptype...]

        @param string name  The name of the method.
        @return array result  The result.
        """
        fn = disp.funcs.get(name)
        if fn is None:
            raise rpc_fault(Fault.SIGNATURE_UNSUPPORTED, name)
        return signature(fn)

    disp.funcs["system.listMethods"] = list_methods
    disp.funcs["system.methodHelp"] = method_help
    disp.funcs["system.methodSignature"] = method_signature
    return disp
