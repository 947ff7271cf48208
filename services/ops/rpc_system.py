"""The ``/RPC2`` dispatcher: every ``supervisor.*`` method of an ``OpsRpc``, the ``system.*``
introspection (``listMethods``, ``methodHelp``, ``methodSignature`` read from the
``@param``/``@return`` lines of each docstring, as supervisord does) and ``multicall``, with the
one boundary that maps errors to supervisord's faults."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any
from xmlrpc.client import Fault as XmlFault
from xmlrpc.server import SimpleXMLRPCDispatcher

from podvisor.ipc.control import Fault
from podvisor.services.ops.rpc_base import rpc_fault

__all__ = ["METHODS", "new_dispatcher", "signature"]

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


def new_dispatcher(rpc: object) -> SimpleXMLRPCDispatcher:
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
