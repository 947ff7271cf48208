"""A real agent with the ops port on, for the ops tests (imported as
``tests.services.ops.opsagent``).

One pod ``web`` (container ``app``, restartPolicy Always) writes a line every 0.2 s, so log
tails see new lines. The agent's ops port is a free port on 127.0.0.1; ``rpc()`` is an
authenticated ``xmlrpc.client.ServerProxy``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import xmlrpc.client
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import TEST_SERVICES, AgentHandle, short_tmp_dir, wait_for_impl
from tests.support.lifecycle import agent_config, free_port, pod_yaml

GROUP = "default.web-e2e"  # a static pod's name gets "-<nodeName>"
APP = f"{GROUP}:app"
TICKER = "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done"


@dataclass
class OpsAgent:
    handle: Any
    port: int
    password: str
    manifests: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rpc(self, user: str = "admin", password: str | None = None) -> Any:
        pw = self.password if password is None else password
        return xmlrpc.client.ServerProxy(f"http://{user}:{pw}@127.0.0.1:{self.port}/RPC2")


def ops_agent(web_yaml: str | None = None, **extra: Any) -> Iterator[OpsAgent]:
    """A generator for a module-scoped fixture: the agent is stopped (by PID) at its end.
    ``web_yaml``: another manifest for the pod ``web`` (container ``app``)."""
    tmp = short_tmp_dir()
    manifests = Path(tempfile.mkdtemp(prefix="pvops", dir="/tmp"))
    (manifests / "web.yaml").write_text(
        web_yaml or pod_yaml("web", TICKER, container="app", grace=1), encoding="utf-8")
    port = free_port()
    cfg = agent_config(manifests, free_port(), **extra)
    cfg["opsPort"] = port
    cfg["rootDir"] = str(tmp / "root")
    cfg["stopPodsOnExit"] = True
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TEST_SERVICES), env.get("PYTHONPATH", "")])
    handle = AgentHandle(tmp, cfg, [], env)
    try:
        handle.wait_ready()
        pw_file = handle.paths.root / "ops-password"
        password = wait_for_impl(lambda: pw_file.exists() and pw_file.read_text().strip(),
                                 20.0, 0.02, "ops-password written")
        ops = OpsAgent(handle, port, password, manifests)
        wait_for_impl(lambda: _app_running(ops), 90.0, 0.05, "web:app RUNNING over XML-RPC")
        yield ops
    finally:
        handle.stop(60.0)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(manifests, ignore_errors=True)


def _app_running(ops: OpsAgent) -> bool:
    try:
        return bool(ops.rpc().supervisor.getProcessInfo(APP)["statename"] == "RUNNING")
    except (OSError, xmlrpc.client.Error):
        return False

