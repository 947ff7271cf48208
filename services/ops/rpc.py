"""supervisord's XML-RPC interface (API 3.0) over the agent and its pods.

``OpsRpc`` holds the methods (``supervisor.*``; names, arguments, results and fault codes as in
supervisord's ``rpcinterface.py``), composed of one class per method group:

- ``rpc_base``: ``RpcDeps``, ``rpc_fault`` and the process model (``RpcBase``);
- ``rpc_info``: identity, supervisor state, process info (``InfoMethods``);
- ``rpc_control``: start / stop / signal of a process, a group, all (``ControlMethods``);
- ``rpc_logs``: the main log and the process logs (``LogMethods``);
- ``rpc_system``: ``new_dispatcher()``, which registers them on the standard library's
  ``SimpleXMLRPCDispatcher`` with ``system.listMethods``, ``methodHelp``, ``methodSignature``
  and ``multicall``.

Methods block (control calls, CRI calls, waits): the HTTP layer runs each request on a worker
thread. Every fault is ``xmlrpc.client.Fault(code, "NAME: detail")``. The mapping of each
method onto subsystems and containers is the table in docs/ARCHITECTURE.md ("The ops port").
"""

from __future__ import annotations

from podvisor.services.ops.rpc_base import RpcDeps, rpc_fault
from podvisor.services.ops.rpc_control import START_WAIT, ControlMethods
from podvisor.services.ops.rpc_info import API_VERSION, InfoMethods
from podvisor.services.ops.rpc_logs import LogMethods
from podvisor.services.ops.rpc_system import METHODS, new_dispatcher

__all__ = ["API_VERSION", "METHODS", "START_WAIT", "OpsRpc", "RpcDeps", "new_dispatcher",
           "rpc_fault"]


class OpsRpc(InfoMethods, ControlMethods, LogMethods):
    """The ``supervisor.*`` methods (registered under that prefix by ``new_dispatcher``)."""
