"""The ops port's XML-RPC over the control protocol's faults (``RpcBase._control``)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any
from xmlrpc.client import Fault as XmlFault

import pytest

from podvisor.ipc.control import AgentNotRunning, ControlClient, ControlFault, Fault
from podvisor.services.ops.rpc import OpsRpc, RpcDeps


def test_xmlrpc_reports_podvisors_own_faults_as_failed(tmp_path: Path) -> None:
    """supervisord's clients know codes up to 92: TIMEOUT and NOT_AVAILABLE (and no answer at
    all) reach them as FAILED; the others pass through with their number."""
    class Faulting(ControlClient):
        def __init__(self, exc: Exception) -> None:
            self.exc = exc

        def call(self, command: str, timeout: float | None = None, **args: Any) -> Any:
            raise self.exc

    def code(exc: Exception) -> int:
        rpc = OpsRpc(RpcDeps(control=Faulting(exc), maps=None,  # type: ignore[arg-type]
                             changed=threading.Condition(), cri=None,  # type: ignore[arg-type]
                             logs_dir=tmp_path, runtime_dir=None, identification="t"))
        with pytest.raises(XmlFault) as err:
            rpc._control("reload")
        return int(err.value.faultCode)

    assert code(ControlFault(Fault.CANT_REREAD, "bad yaml")) == 92
    assert code(ControlFault(Fault.NOT_AVAILABLE, "no")) == 30
    assert code(ControlFault(Fault.TIMEOUT, "slow")) == 30
    assert code(AgentNotRunning("no answer")) == 30
