"""The core of every harness that runs a real agent: ``AgentProcess`` (one ``podvisor run``
subprocess on its own config and rootDir, and a control client), ``wait_until`` and the
process-table scans that find what a run left behind.

An agent started here gets a ``cgroupRoot`` of its own (``/podvisor-run-<hex>``) unless its
config names one, and ``remove_cgroup_root`` removes that root's (empty) folders once it has
stopped: an agent's leftover scan removes the empty ``pod<uid>`` folders it does not know under
its root (the kubelet's orphaned pod cgroups), so two agents on one root (two tests, a test run
beside the machine's own agent) would remove each other's pods' folders between the sandbox and
the container's start.

One core, three users: the ``podvisor_node`` fixture (``node.py``, ``plugin.py``), the suite's
``agent`` fixture (tests/conftest.py's ``AgentHandle`` is this class) and ``podvisor chaos``
(``cli/chaos.py``). Nothing here imports pytest.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any, TypeVar

import psutil
import yaml

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.control import AgentNotRunning, ControlClient, ControlError
from podvisor.ipc.paths import RunPaths

__all__ = ["AgentProcess", "agent_argv", "ctl_argv", "processes_of_root", "remove_cgroup_tree",
           "wait_until"]

T = TypeVar("T")
BIN = Path(sys.executable).parent
CGROUP_MOUNT = Path("/sys/fs/cgroup")


def remove_cgroup_tree(relative: str, mount: Path = CGROUP_MOUNT) -> None:
    """Remove cgroup ``relative`` and the folders under it in every hierarchy (v1: each
    controller's mount under ``mount``; v2: ``mount`` itself), deepest first. A folder still
    holding processes, or gone meanwhile, is left as it is."""
    rel = relative.strip("/")
    if not rel or ".." in rel.split("/"):
        raise ValueError(f"refusing to remove cgroup {relative!r}")
    for folder in [mount / rel, *mount.glob(f"*/{rel}")]:
        # os.walk, not rglob: a folder removed while it is walked is skipped
        for here, dirs, _files in os.walk(folder, topdown=False):
            for name in dirs:
                with contextlib.suppress(OSError):
                    (Path(here) / name).rmdir()
        with contextlib.suppress(OSError):
            folder.rmdir()


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02,
               message: str = "") -> T:
    """Call ``predicate`` until it returns something truthy (returned); AssertionError after
    ``timeout`` seconds naming ``message`` and the last value. Never a fixed sleep: the
    condition is what is waited for."""
    deadline = SYSTEM_CLOCK.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if SYSTEM_CLOCK.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for "
                                 f"{message or predicate}: last value {value!r}")
        time.sleep(interval)


def _script(name: str, module: str) -> list[str]:
    """The console script beside this Python, else the module through this Python."""
    script = BIN / name
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main())"]


def agent_argv(config: Path, *extra: str) -> list[str]:
    return [*_script("podvisor", "podvisor.cli.agent"), "run", "--config", str(config), *extra]


def ctl_argv(root: Path, *args: str) -> list[str]:
    return [*_script("podvisorctl", "podvisor.cli.ctl"), "--root-dir", str(root), *args]


class AgentProcess:
    """A ``podvisor run`` subprocess with its config (written to ``<workdir>/config.yaml``),
    its rootDir (the config's, else ``<workdir>/root``), its output in
    ``<workdir>/agent.stderr`` and a control client. ``start()`` again after an exit (or a
    SIGKILL) runs a new agent on the same config. Stopped by PID, never by name."""

    def __init__(self, workdir: Path, config: dict[str, Any], extra_args: Iterable[str] = (),
                 env: dict[str, str] | None = None, *, start: bool = True,
                 new_session: bool = True) -> None:
        self.root = workdir
        config.setdefault("rootDir", str(workdir / "root"))
        self.own_cgroup_root = ""  # the cgroupRoot made up here (removed by remove_cgroup_root)
        if "cgroupRoot" not in config:
            self.own_cgroup_root = config["cgroupRoot"] = f"/podvisor-run-{secrets.token_hex(4)}"
        self.paths = RunPaths(Path(config["rootDir"]))
        self.config = config
        self.config_path = workdir / "config.yaml"
        self.write_config(config)
        self.stderr_path = workdir / "agent.stderr"
        self.extra_args = list(extra_args)
        self.env = env
        self.new_session = new_session  # its own process group, as in a terminal
        self._stderr: IO[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = ControlClient(self.paths.control, timeout=10.0)
        if start:
            self.start()

    def write_config(self, config: dict[str, Any]) -> None:
        if self.own_cgroup_root:  # a new config keeps the agent's own root
            config.setdefault("cgroupRoot", self.own_cgroup_root)
        self.config = config
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")

    def start(self) -> None:
        if self._stderr is None or self._stderr.closed:
            self._stderr = self.stderr_path.open("ab")
        self.proc = subprocess.Popen(
            agent_argv(self.config_path, *self.extra_args), stdin=subprocess.DEVNULL,
            stdout=self._stderr, stderr=self._stderr, env=self.env, cwd=str(self.root),
            start_new_session=self.new_session)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # --- the control endpoint ------------------------------------------------------------

    def call(self, command: str, timeout: float | None = None, **args: Any) -> Any:
        return self.client.call(command, timeout=timeout, **args)

    def status(self) -> dict[str, dict[str, Any]]:
        """Every supervised process's ``status`` row, by name."""
        return {p["name"]: p for p in self.call("status")["processes"]}

    def rows(self) -> dict[str, dict[str, Any]]:
        """``status()``, or {} while no agent answers (starting, restarting, stopping)."""
        try:
            return self.status()
        except (ControlError, OSError):
            return {}

    def state(self, name: str) -> dict[str, Any]:
        return self.status()[name]

    def wait_state(self, name: str, state: str, timeout: float = 15.0,
                   where: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            row = self.rows().get(name)
            if row and row["state"] == state and (where is None or where(row)):
                return row
            return None
        row = wait_until(check, timeout, 0.02, f"{name} to be {state}")
        assert row is not None
        return row

    def wait_ready(self, timeout: float = 20.0) -> None:
        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"agent exited {self.proc.returncode}:\n{self.stderr()}")
            try:
                self.call("status", timeout=1.0)
            except AgentNotRunning:
                return False
            return True
        wait_until(up, timeout, 0.02, "agent control endpoint")

    def ctl(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """``podvisorctl --root-dir <rootDir> *args``, as an operator runs it."""
        return subprocess.run(ctl_argv(self.paths.root, *args), capture_output=True, text=True,
                              timeout=timeout)

    def stderr(self) -> str:
        if self._stderr is not None and not self._stderr.closed:
            self._stderr.flush()
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")[-20000:]
        except OSError:
            return ""

    # --- ending it -----------------------------------------------------------------------

    def kill(self) -> None:
        """SIGKILL the agent (its subsystems follow by their parent-death signal; pods live on)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def remove_cgroup_root(self) -> None:
        """Once the agent stopped: the cgroupRoot made up for it, with whatever empty pod
        folders it left (containerd 1.6 leaves them); nothing when the config named one."""
        if self.own_cgroup_root:
            remove_cgroup_tree(self.own_cgroup_root)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM the agent (by PID) and wait for it; SIGKILL if it does not exit in time."""
        code = 0
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            code = self.proc.returncode
        if self._stderr is not None:
            self._stderr.close()
        return code

    def shutdown_pods(self, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
        """``podvisorctl shutdown --pods`` (the agent stops every pod, then itself; with no
        agent answering, podvisorctl stops the pods itself), then wait for the agent."""
        done = self.ctl("shutdown", "--pods", timeout=timeout)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        return done


def processes_of_root(root: Path | None, marker: tuple[str, str] | None = None,
                      also: Callable[[psutil.Process], bool] | None = None
                      ) -> list[psutil.Process]:
    """Live processes of an agent's run, from the kernel's process table: those whose
    environment says ``PODVISOR_ROOT_DIR=<root>`` (supervisor children, the runtime's zygote and
    monitors), those carrying ``marker`` (an env name and a value prefix: containers a harness
    marked), and those ``also`` accepts. ``root`` None: the marked and accepted ones only."""
    out = []
    root_s = None if root is None else str(root)
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.pid == os.getpid():
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            env = proc.environ()
        except psutil.Error:
            continue
        if (root_s is not None and env.get("PODVISOR_ROOT_DIR") == root_s) or (
                marker is not None and env.get(marker[0], "").startswith(marker[1])) or (
                also is not None and also(proc)):
            out.append(proc)
    return out
