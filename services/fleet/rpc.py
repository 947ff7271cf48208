"""The fleet's XML-RPC at ``/RPC2`` (supervisord's API 3.0 over every node, and ``fleet.*``).

A script that speaks to many supervisords keeps working against podvisor nodes in two ways:

- each node's own ``/RPC2`` (supervisord's whole API; directly, or through the fleet as
  ``/nodes/NODE/RPC2`` with the fleet's credentials: the fleet adds the node's);
- the fleet's ``/RPC2``, one supervisord over all nodes: ``supervisor.getAllProcessInfo`` lists
  every reachable node's processes with the group ``NODE/GROUP`` (so ``supervisorctl -s
  http://FLEET status`` shows ``node-a/agent:pleg``); ``getProcessInfo``, ``startProcess``,
  ``stopProcess``, ``signalProcess``, ``readProcessStdoutLog``, ``tailProcessStdoutLog`` take
  ``NODE/GROUP:NAME`` and are forwarded to that node with its credentials (faults pass
  through; an unknown node is BAD_NAME, a node that is down FAILED);
- ``fleet.getAllNodeInfo()``: ``[{name, url, reachable, statename: UP|DOWN, error, since}]``;
  ``fleet.getAllProcessInfo()``: every process of every reachable node with its ``node``
  (the groups as each node names them).

Reads come from the nodes' live feeds (nothing waits on a node); forwarded calls block a worker
thread, never the event loop. Every fault is supervisord's ``Fault(code, "NAME: detail")``.
"""

from __future__ import annotations

import os
import ssl
import xmlrpc.client
from collections.abc import Callable, Mapping
from typing import Any
from xmlrpc.client import Fault as XmlFault
from xmlrpc.server import SimpleXMLRPCDispatcher

from podvisor.ipc.clock import Clock
from podvisor.ipc.control import Fault
from podvisor.services.fleet.config import NodeSpec
from podvisor.services.fleet.link import NodeView
from podvisor.services.fleet.model import process_infos

__all__ = ["FleetRpc", "new_fleet_dispatcher"]

FORWARD_TIMEOUT = 75.0
SUPERVISOR = ("getAPIVersion", "getVersion", "getSupervisorVersion", "getIdentification",
              "getState", "getPID", "getAllProcessInfo", "getProcessInfo", "startProcess",
              "stopProcess", "signalProcess", "readProcessStdoutLog", "tailProcessStdoutLog")
FLEET = ("getAllNodeInfo", "getAllProcessInfo")
Nodes = Callable[[], Mapping[str, tuple[NodeView, NodeSpec]]]


def fault(code: Fault, detail: str = "") -> XmlFault:
    return XmlFault(int(code), f"{code.name}: {detail}" if detail else code.name)


class _Transport(xmlrpc.client.Transport):
    def __init__(self, timeout: float) -> None:
        super().__init__()
        self._timeout = timeout

    def make_connection(self, host: Any) -> Any:
        conn = super().make_connection(host)
        conn.timeout = self._timeout
        return conn


class _SafeTransport(xmlrpc.client.SafeTransport):
    def __init__(self, timeout: float, context: ssl.SSLContext) -> None:
        super().__init__(context=context)
        self._timeout = timeout

    def make_connection(self, host: Any) -> Any:
        conn = super().make_connection(host)
        conn.timeout = self._timeout
        return conn


def node_proxy(spec: NodeSpec, timeout: float = FORWARD_TIMEOUT) -> Any:
    """An ``xmlrpc.client.ServerProxy`` to the node's ``/RPC2`` with its credentials."""
    from urllib.parse import quote, urlsplit

    url = urlsplit(spec.url)
    full = f"{url.scheme}://{quote(spec.username, safe='')}:{quote(spec.password, safe='')}" \
           f"@{url.netloc}/RPC2"
    transport: xmlrpc.client.Transport
    if url.scheme == "https":
        transport = _SafeTransport(timeout, ssl.create_default_context(cafile=spec.ca_file))
    else:
        transport = _Transport(timeout)
    return xmlrpc.client.ServerProxy(full, transport=transport)


class FleetRpc:
    def __init__(self, nodes: Nodes, clock: Clock, identification: str = "podvisor-fleet",
                 proxy: Callable[[NodeSpec], Any] = node_proxy) -> None:
        self.nodes, self.clock, self.proxy = nodes, clock, proxy
        self.identification = identification

    # -- helpers -----------------------------------------------------------------------
    def _split(self, namespec: str) -> tuple[NodeView, NodeSpec, str]:
        node, sep, rest = str(namespec).partition("/")
        found = self.nodes().get(node)
        if not sep or found is None:
            raise fault(Fault.BAD_NAME, str(namespec))
        view, spec = found
        if not view.up:
            raise fault(Fault.FAILED, f"node {node} is down: {view.error}")
        return view, spec, rest

    def _forward(self, method: str, namespec: str, *args: Any) -> Any:
        _, spec, rest = self._split(namespec)
        try:
            return getattr(self.proxy(spec).supervisor, method)(rest, *args)
        except XmlFault:
            raise
        except (OSError, xmlrpc.client.ProtocolError) as err:
            raise fault(Fault.FAILED, f"node {spec.name}: {err}") from None

    # -- supervisor.* over the fleet ---------------------------------------------------
    def getAPIVersion(self) -> str:
        """ Return the version of the RPC API used by supervisord

        @return string version version id
        """
        return "3.0"

    getVersion = getAPIVersion

    def getSupervisorVersion(self) -> str:
        """ Return the version of the supervisor package in use by supervisord

        @return string version version id
        """
        return "podvisor fleet"

    def getIdentification(self) -> str:
        """ Return identifying string of supervisord

        @return string identifier identifying string
        """
        return self.identification

    def getState(self) -> dict[str, Any]:
        """ Return current state of supervisord as a struct

        @return struct A struct with keys int statecode, string statename
        """
        return {"statecode": 1, "statename": "RUNNING"}

    def getPID(self) -> int:
        """ Return the PID of supervisord

        @return int PID
        """
        return os.getpid()

    def getAllProcessInfo(self) -> list[dict[str, Any]]:
        """ Get info about all processes of every reachable node (group: NODE/GROUP)

        @return array result  An array of process status results
        """
        out = []
        for name, (view, _) in sorted(self.nodes().items()):
            out.extend(process_infos(view, f"{name}/"))
        return out

    def getProcessInfo(self, name: str) -> dict[str, Any]:
        """ Get info about a process named NODE/GROUP:NAME (asked of the node)

        @param string name The name of the process (NODE/GROUP:NAME)
        @return struct result     A structure containing data about the process
        """
        info = self._forward("getProcessInfo", name)
        node = str(name).partition("/")[0]
        return {**info, "group": f"{node}/{info.get('group', '')}"}

    def startProcess(self, name: str, wait: bool = True) -> bool:
        """ Start a process on its node

        @param string name Process name (NODE/GROUP:NAME)
        @param boolean wait Wait for process to be fully started
        @return boolean result     Always true unless error
        """
        return bool(self._forward("startProcess", name, wait))

    def stopProcess(self, name: str, wait: bool = True) -> bool:
        """ Stop a process on its node

        @param string name  The name of the process to stop (NODE/GROUP:NAME)
        @param boolean wait        Wait for the process to be fully stopped
        @return boolean result     Always return True unless error
        """
        return bool(self._forward("stopProcess", name, wait))

    def signalProcess(self, name: str, signal: str) -> bool:
        """ Send an arbitrary UNIX signal to a process on its node

        @param string name    Name of the process to signal (NODE/GROUP:NAME)
        @param string signal  Signal to send, as name ('HUP') or number ('1')
        @return boolean
        """
        return bool(self._forward("signalProcess", name, signal))

    def readProcessStdoutLog(self, name: str, offset: int, length: int) -> str:
        """ Read length bytes from name's stdout log starting at offset

        @param string name        the name of the process (NODE/GROUP:NAME)
        @param int offset         offset to start reading from.
        @param int length         number of bytes to read from the log.
        @return string result     Bytes of log
        """
        return str(self._forward("readProcessStdoutLog", name, offset, length))

    def tailProcessStdoutLog(self, name: str, offset: int, length: int) -> list[Any]:
        """ Provides a more efficient way to tail the (stdout) log than readProcessStdoutLog.

        @param string name         the name of the process (NODE/GROUP:NAME)
        @param int offset          offset to start reading from
        @param int length          maximum number of bytes to return
        @return array result       [string bytes, int offset, bool overflow]
        """
        return list(self._forward("tailProcessStdoutLog", name, offset, length))

    # -- fleet.* -------------------------------------------------------------------------
    def getAllNodeInfo(self) -> list[dict[str, Any]]:
        """ Every node of the fleet: whether it is reachable, since when, and why not

        @return array result  [{name, url, reachable, statename, error, since}]
        """
        return [{"name": name, "url": view.url, "reachable": view.up,
                 "statename": "UP" if view.up else "DOWN", "error": view.error,
                 "since": int(view.since)}
                for name, (view, _) in sorted(self.nodes().items())]

    def fleetGetAllProcessInfo(self) -> list[dict[str, Any]]:
        """ Every process of every reachable node, with its node

        @return array result  getProcessInfo structs with a 'node' key
        """
        return [{**info, "node": name} for name, (view, _) in sorted(self.nodes().items())
                for info in process_infos(view)]


class _Dispatcher(SimpleXMLRPCDispatcher):
    def _dispatch(self, method: str, params: Any) -> Any:
        import inspect

        fn = self.funcs.get(method)
        if fn is None:
            raise fault(Fault.UNKNOWN_METHOD)
        try:
            inspect.signature(fn).bind(*params)
        except TypeError:
            raise fault(Fault.INCORRECT_PARAMETERS) from None
        try:
            return fn(*params)
        except XmlFault:
            raise
        except Exception as err:
            raise fault(Fault.FAILED, f"{method}: {err!r}") from None


def new_fleet_dispatcher(rpc: FleetRpc) -> SimpleXMLRPCDispatcher:
    disp = _Dispatcher(allow_none=False, encoding="utf-8")
    for name in SUPERVISOR:
        disp.register_function(getattr(rpc, name), f"supervisor.{name}")
    disp.register_function(rpc.getAllNodeInfo, "fleet.getAllNodeInfo")
    disp.register_function(rpc.fleetGetAllProcessInfo, "fleet.getAllProcessInfo")
    disp.register_introspection_functions()
    disp.register_multicall_functions()
    return disp
