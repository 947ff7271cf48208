"""The commands the agent prints as advice, spelled so they can be pasted into a shell as is.

- At start (`start_advice`): how to look at the running agent from another shell
  (`podvisorctl --root-dir DIR status`, `... pods`, `curl -s http://ADDR:PORT/pods` when the
  read-only port is on).
- At start with graceful node shutdown on: `node_shutdown_command(root)` (`podvisorctl shutdown
  --node`), and what Ctrl-C does with `shutdownOnSignal`.
- On exit with pods left running, and after RunOnce: `stop_pods_command(root)`, which stops them
  with or without an agent (`podvisorctl shutdown --pods`, see `ctl_stoppods.py`).

`podvisorctl` is named as a shell finds it: the bare name when PATH leads to the one installed
beside this Python, else its full path (a venv that is not on PATH), else `python -m`. Every
command here is run by a test exactly as printed (tests/supervisor/test_advice.py,
tests/supervisor/test_e2e_lifecycle_restart.py, tests/services/syncloop/test_e2e_runonce.py,
tests/services/nodeshutdown/test_e2e_node_shutdown.py).
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

from podvisor.common.config import Config, node_shutdown_groups

__all__ = ["ctl_program", "node_shutdown_command", "start_advice", "stop_pods_command"]

ANY_ADDRESS = {"0.0.0.0", "::", ""}


def ctl_program() -> str:
    """How to call `podvisorctl` from a shell."""
    beside = Path(sys.executable).parent / "podvisorctl"
    found = shutil.which("podvisorctl")
    if beside.exists():
        if found is not None and Path(found).resolve() == beside.resolve():
            return "podvisorctl"
        return shlex.quote(str(beside))
    if found is not None:
        return "podvisorctl"
    return f"{shlex.quote(sys.executable)} -m podvisor.cli.ctl"


def _ctl(root: Path | str, *args: str) -> str:
    return " ".join([ctl_program(), "--root-dir", shlex.quote(str(root)), *args])


def stop_pods_command(root: Path | str) -> str:
    """The exact command that stops every pod of the agent on `root`, with or without it."""
    return _ctl(root, "shutdown", "--pods")


def start_advice(config: Config, manages_pods: bool) -> list[str]:
    """The lines printed when the agent starts (not for RunOnce, which ends by itself)."""
    root = config.root_dir
    drains = manages_pods and bool(node_shutdown_groups(config))  # graceful node shutdown on
    ctrl_c = ("Ctrl-C drains the node (graceful node shutdown), then stops the agent"
              if drains and config.shutdown_on_signal
              else "Ctrl-C stops the agent, pods keep running")
    lines = [f"podvisor: running on rootDir {root} ({ctrl_c}); from another shell:",
             f"  {_ctl(root, 'status')}"]
    if manages_pods:
        lines.append(f"  {_ctl(root, 'pods')}")
        if config.read_only_port:
            host = "127.0.0.1" if config.address in ANY_ADDRESS else config.address
            if ":" in host:
                host = f"[{host}]"
            lines.append(f"  curl -s http://{host}:{config.read_only_port}/pods")
    if drains:
        lines.append(f"  {node_shutdown_command(root)}")
    return lines


def node_shutdown_command(root: Path | str) -> str:
    """The exact command for a graceful node shutdown of the agent on `root`."""
    return _ctl(root, "shutdown", "--node")
