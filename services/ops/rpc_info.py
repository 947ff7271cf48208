"""``supervisor.*`` status and identity methods (supervisord's rpcinterface "Status and
Control" and "Process Info" sections): versions, identification, state, pid, shutdown, restart,
reloadConfig, getProcessInfo, getAllProcessInfo, getAllConfigInfo."""

from __future__ import annotations

import os
import signal
from importlib import metadata
from typing import Any

from podvisor.services.ops.logevents import events_enabled
from podvisor.services.ops.rpc_base import RpcBase
from podvisor.services.ops.states import RUNNING_STATES, SupervisorState

__all__ = ["API_VERSION", "InfoMethods"]

API_VERSION = "3.0"


class InfoMethods(RpcBase):
    """Identity, supervisor state and process info."""

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
        desired = self.d.maps().desired
        for p in self._all():
            stdout_events, stderr_events = events_enabled(p, self.d.process_specs, desired)
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
                "stdout_capture_maxbytes": 0, "stdout_events_enabled": stdout_events,
                "stdout_logfile": p.logfile, "stdout_logfile_backups": 0,
                "stdout_logfile_maxbytes": 0, "stdout_syslog": False,
                "stopsignal": int(signal.SIGTERM),
                "stopwaitsecs": int(p.extra.get("grace", 5)),
                "stderr_capture_maxbytes": 0, "stderr_events_enabled": stderr_events,
                "stderr_logfile": "", "stderr_logfile_backups": 0,
                "stderr_logfile_maxbytes": 0, "stderr_syslog": False, "serverurl": "AUTO",
            })
        return out
