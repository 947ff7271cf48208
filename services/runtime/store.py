"""The embedded runtime's state on disk, under its root. All writes are atomic (tmp + rename).

  <root>/sandboxes/<id>/config.pb   PodSandboxConfig      <root>/sandboxes/<id>/meta.json
  <root>/containers/<id>/config.pb  ContainerConfig       <root>/containers/<id>/meta.json
  <root>/containers/<id>/spec.json  what the monitor runs (argv, env, cwd, log_path)
  <root>/containers/<id>/started.json, exit.json   written by the monitor (see monitor.py)
A sandbox's or container's directory exists exactly as long as the object does. Readers ignore
half-written ``*.tmp.*`` files, so a runtime killed mid-write leaves nothing ambiguous.
"""

from __future__ import annotations

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
from podvisor.services.runtime.monitor import write_json_atomic


def _write_bytes_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    tmp.write_bytes(data)
    os.rename(tmp, path)


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

    def container_dir(self, container_id: str) -> Path:
        return self.containers_dir / container_id

    # --- sandboxes ---
    def save_sandbox(self, sb: Sandbox) -> None:
        d = self.sandboxes_dir / sb.id
        d.mkdir(exist_ok=True)
        _write_bytes_atomic(d / "config.pb", sb.config.SerializeToString())
        write_json_atomic(str(d / "meta.json"), {
            "created_at": sb.created_at, "state": sb.state.value,
            "runtime_handler": sb.runtime_handler,
        })

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
    def save_container(self, c: Container, spec: dict[str, Any]) -> None:
        d = self.container_dir(c.id)
        d.mkdir(exist_ok=True)
        write_json_atomic(str(d / "spec.json"), spec)
        _write_bytes_atomic(d / "config.pb", c.config.SerializeToString())
        write_json_atomic(str(d / "meta.json"), {
            "sandbox_id": c.sandbox_id, "created_at": c.created_at, "log_path": c.log_path,
            "image_ref": c.image_ref,
        })

    def save_exit(self, container_id: str, info: ExitInfo) -> None:
        write_json_atomic(str(self.container_dir(container_id) / "exit.json"), {
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
