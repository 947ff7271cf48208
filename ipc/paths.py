"""Where every socket, log and state file of one node lives: all under ``rootDir``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# A unix socket path must fit in sockaddr_un.sun_path (108 bytes with the NUL).
MAX_SOCKET_PATH = 107


@dataclass(frozen=True)
class RunPaths:
    """The directory layout of one agent. Pure naming; ``ensure()`` is the only effect."""

    root: Path

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def runtime_dir(self) -> Path:
        return self.root / "runtime"

    @property
    def pods_dir(self) -> Path:
        return self.root / "pods"

    @property
    def pod_logs_dir(self) -> Path:
        return self.root / "pod-logs"

    @property
    def bus_pub(self) -> str:
        """Publishers connect here (the proxy's XSUB side)."""
        return self._ipc("bus-pub.sock")

    @property
    def bus_sub(self) -> str:
        """Subscribers connect here (the proxy's XPUB side)."""
        return self._ipc("bus-sub.sock")

    @property
    def control(self) -> str:
        return self._ipc("control.sock")

    @property
    def heartbeat(self) -> str:
        return self._ipc("heartbeat.sock")

    @property
    def cri_socket(self) -> Path:
        return self.run_dir / "cri.sock"

    @property
    def config_json(self) -> Path:
        return self.run_dir / "config.json"

    @property
    def runonce_results(self) -> Path:
        """RunOnce's results, written by the ``runonce`` process, read by the supervisor."""
        return self.run_dir / "runonce.json"

    @property
    def faults_dir(self) -> Path:
        """The injected faults in force (``faults.json``, written by the supervisor): a quiet
        directory of its own, so each process's inotify watch on it wakes only for them."""
        return self.run_dir / "faults"

    @property
    def faults_file(self) -> Path:
        return self.faults_dir / "faults.json"

    def snapshot(self, map_name: str) -> str:
        """The ROUTER endpoint where the owner of ``map_name`` serves snapshots."""
        if not map_name or "/" in map_name:
            raise ValueError(f"bad map name {map_name!r}")
        return self._ipc(f"snap-{map_name}.sock")

    def ensure(self) -> None:
        """Create every directory; ``run/`` is private to the agent's user (mode 0700)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.run_dir, 0o700)
        self.faults_dir.mkdir(exist_ok=True)
        for d in (self.logs_dir, self.state_dir, self.runtime_dir, self.pods_dir,
                  self.pod_logs_dir):
            d.mkdir(exist_ok=True)

    def _ipc(self, name: str) -> str:
        path = self.run_dir / name
        if len(str(path)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes; use a shorter rootDir"
            )
        return f"ipc://{path}"
