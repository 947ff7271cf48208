"""The embedded runtime's state on disk, under its root.

  <root>/sandboxes/<id>/config.pb   PodSandboxConfig      <root>/sandboxes/<id>/meta.json
  <root>/containers/<id>/config.pb  ContainerConfig       <root>/containers/<id>/meta.json
  <root>/containers/<id>/spec.json  what the monitor runs (argv, env, cwd, log_path)
  <root>/containers/<id>/started.json, exit.json   written by the monitor (see monitor.py)
  <root>/exits.sock   the datagram socket monitors send exit notes to (watcher.py)
A sandbox's or container's directory exists exactly as long as the object does. ``meta.json``
is written last at creation: a directory without it is a create that never finished (dropped at
load), so the files of a new object are written plainly (one open/write/close each, no tmp +
rename); a rewrite of an existing ``meta.json`` is atomic (tmp + rename; readers ignore the
``*.tmp.*`` files), so a runtime killed mid-write leaves nothing ambiguous.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from cri_api.v1 import api_pb2 as pb

from podvisor.services.runtime.model import (
    Container,
    ExitInfo,
    Sandbox,
    SandboxState,
    StartInfo,
)
from podvisor.services.runtime.monitor import write_json_atomic, write_new


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class Store:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.sandboxes_dir = root / "sandboxes"
        self.containers_dir = root / "containers"
        for d in (self.sandboxes_dir, self.containers_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._sandboxes = str(self.sandboxes_dir)
        self._containers = str(self.containers_dir)

    def container_dir(self, container_id: str) -> Path:
        return self.containers_dir / container_id

    def container_path(self, container_id: str) -> str:
        """``container_dir`` as a string (pathlib costs ~10 us a join on the hot path)."""
        return f"{self._containers}/{container_id}"

    # --- sandboxes ---
    def save_sandbox(self, sb: Sandbox, new: bool = True) -> None:
        """``new``: a sandbox being created (else only its state changed: meta.json is
        replaced atomically)."""
        d = f"{self._sandboxes}/{sb.id}"
        meta = {"created_at": sb.created_at, "state": sb.state.value,
                "runtime_handler": sb.runtime_handler}
        if not new:
            write_json_atomic(f"{d}/meta.json", meta)
            return
        with contextlib.suppress(FileExistsError):
            os.mkdir(d)
        write_new(f"{d}/config.pb", sb.config.SerializeToString())
        write_new(f"{d}/meta.json", json.dumps(meta).encode())  # last: the commit

    def delete_sandbox(self, sandbox_id: str) -> None:
        shutil.rmtree(self.sandboxes_dir / sandbox_id, ignore_errors=True)

    def load_sandboxes(self) -> list[Sandbox]:
        out = []
        for d in self.sandboxes_dir.iterdir():
            meta = _read_json(d / "meta.json")
            try:
                config = pb.PodSandboxConfig.FromString((d / "config.pb").read_bytes())
            except (OSError, ValueError):
                config = None
            if meta is None or config is None:
                shutil.rmtree(d, ignore_errors=True)  # a create that never finished
                continue
            out.append(Sandbox(d.name, config, int(meta["created_at"]),
                               SandboxState(meta["state"]), str(meta["runtime_handler"])))
        return out

    # --- containers ---
    def save_container(self, c: Container, spec: bytes) -> None:
        """``spec``: spec.json's content (JSON: argv, env, cwd, log_path)."""
        d = self.container_path(c.id)
        with contextlib.suppress(FileExistsError):
            os.mkdir(d)
        write_new(f"{d}/spec.json", spec)
        write_new(f"{d}/config.pb", c.config.SerializeToString())
        write_new(f"{d}/meta.json", json.dumps({  # last: the commit
            "sandbox_id": c.sandbox_id, "created_at": c.created_at, "log_path": c.log_path,
            "image_ref": c.image_ref,
        }).encode())

    def read_spec(self, container_id: str) -> bytes:
        with open(f"{self.container_path(container_id)}/spec.json", "rb") as f:
            return f.read()

    def save_exit(self, container_id: str, info: ExitInfo) -> None:
        write_json_atomic(f"{self.container_path(container_id)}/exit.json", {
            "exit_code": info.exit_code, "finished_at": info.finished_at,
            "reason": info.reason, "message": info.message,
        })

    def read_started(self, container_id: str) -> StartInfo | None:
        data = _read_json(self.container_dir(container_id) / "started.json")
        if data is None:
            return None
        return StartInfo(int(data["monitor_pid"]), int(data["monitor_ticks"] or 0),
                         int(data["pid"]), int(data["pid_ticks"] or 0), int(data["started_at"]))

    def read_exit(self, container_id: str) -> ExitInfo | None:
        data = _read_json(self.container_dir(container_id) / "exit.json")
        if data is None:
            return None
        return ExitInfo(int(data["exit_code"]), int(data["finished_at"]), str(data["reason"]),
                        str(data.get("message", "")))

    def delete_container(self, container_id: str) -> None:
        shutil.rmtree(self.container_dir(container_id), ignore_errors=True)

    def load_containers(self) -> list[Container]:
        out = []
        for d in self.containers_dir.iterdir():
            meta = _read_json(d / "meta.json")
            try:
                config = pb.ContainerConfig.FromString((d / "config.pb").read_bytes())
            except (OSError, ValueError):
                config = None
            if meta is None or config is None:
                shutil.rmtree(d, ignore_errors=True)
                continue
            out.append(Container(
                d.name, str(meta["sandbox_id"]), config, int(meta["created_at"]),
                str(meta["log_path"]), str(meta["image_ref"]),
                self.read_started(d.name), self.read_exit(d.name),
            ))
        return out
