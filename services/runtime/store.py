"""The embedded runtime's state on disk, under its root.

  <root>/meta.jsonl                     the journal of the sandboxes and containers the CRI
                                        created (containerd keeps the same in one bolt file)
  <root>/containers/<id>.started.json   written by the container's monitor (monitor.py)
  <root>/containers/<id>.exit.json      written by the monitor, or by the runtime when it
                                        decided the exit itself (a failed start, a lost monitor)
  <root>/exits.sock                     the socket monitors send exit notes to (watcher.py)

Why a journal and flat files: creating a file or a directory costs 0.15-0.45 ms of CPU on the
ext4 of the benchmark machine (inode allocation; more in a new directory), against ~10 us to
append to an open file. The previous layout made two directories and five files per pod, plus
the monitor's two: 3-9 ms of CPU per pod started. Now a created sandbox or container is one
appended line, and a started container one new file in a shared directory (its monitor writes
it; see below).

The journal: one JSON object per line, applied in order at load.
  {"op": "sandbox", "id", "config": base64 PodSandboxConfig, "created_at", "state", "handler",
   "net": {"netns", "ips", "ready"} (a sandbox with a network namespace of its own)}
                                  (also when its state changes: the last one wins)
  {"op": "sandbox_del", "id"}
  {"op": "container", "id", "sandbox_id", "config": base64 ContainerConfig, "spec": the text
   the monitor runs (JSON: argv, env, cwd, log_path), "created_at", "log_path", "image_ref"}
  {"op": "container_del", "id"}
  {"op": "start", "id", "monitor": [pid, start ticks]}
                                  the start's intent, written before the container is sent to
                                  the monitor: a runtime restarted before started.json exists
                                  finds the monitor by it (engine.py ``_settle``); the last
                                  one wins, and it goes with the container's record
Each change is ONE ``write`` of a whole line with O_APPEND, so a runtime killed at any point
leaves whole lines (the page cache outlives the process; no fsync, as in status/store.py: after
a power loss the containers are gone too). A line that does not parse (torn by a power loss)
ends the replay and is logged. The load rewrites the journal from what it read, and when the
journal grows past twice the live records (plus ``COMPACT_SLACK``) a change rewrites it: the
live records to a tmp file, renamed over the journal. So no change may come before the load
(it is refused).

Monitor files: the monitor writes ``started.json`` (one write of a new file) before it answers
the start, and ``exit.json`` (tmp + rename) when the container is gone; the runtime reads them
at load to re-adopt running containers and to learn exits that happened while it was down. They
are removed with the container; at load, files of containers the journal does not know (a
runtime killed between a removal's line and the unlink) are removed too.

The previous layout (``sandboxes/<id>/{config.pb,meta.json}``, ``containers/<id>/{config.pb,
meta.json,spec.json,started.json,exit.json}``) is imported at load (an agent upgraded while its
pods run adopts them): its records go into the journal and its files away, except the monitor
files of containers still known, which their (older) monitors may still write: those are read
from the old directory, removed with the container.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from cri_api.v1 import api_pb2 as pb

from podvisor.services.runtime.faults import Fault
from podvisor.services.runtime.model import (
    Container,
    ExitInfo,
    Sandbox,
    SandboxNetwork,
    SandboxState,
    StartInfo,
)
from podvisor.services.runtime.monitor import write_json_atomic, write_new

JOURNAL = "meta.jsonl"
COMPACT_SLACK = 256 * 1024  # journal bytes beyond twice the live records before a compaction
STARTED = ".started.json"
EXITED = ".exit.json"
SECCOMP = ".seccomp"  # the container's seccomp filter for exec'd commands (seccomp_exec.py)
CONTAINER_FIELDS = ("sandbox_id", "config", "spec", "created_at", "log_path", "image_ref")


class StoreError(Fault):
    """The journal could not be written: the change did not happen (INTERNAL to the caller)."""

    def __init__(self, message: str) -> None:
        super().__init__(grpc.StatusCode.INTERNAL, message)


@dataclass
class Loaded:
    sandboxes: list[Sandbox] = field(default_factory=list)
    containers: list[Container] = field(default_factory=list)
    specs: dict[str, bytes] = field(default_factory=dict)  # container id -> spec.json text
    # container id -> (pid, start ticks) of the monitor its last start went to (the intent)
    starting: dict[str, tuple[int, int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # to log: what was unreadable, skipped
    notes: list[str] = field(default_factory=list)  # to log: what was imported


def _read_json(path: str | Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _line(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def _sandbox_record(sb: Sandbox) -> dict[str, Any]:
    rec = {"op": "sandbox", "id": sb.id, "config": _b64(sb.config.SerializeToString()),
           "created_at": sb.created_at, "state": sb.state.value, "handler": sb.runtime_handler}
    if sb.network is not None:
        rec["net"] = {"netns": sb.network.netns, "ips": list(sb.network.ips),
                      "ready": sb.network.ready}
    return rec


def _sandbox_network(raw: Any) -> SandboxNetwork | None:
    if not isinstance(raw, dict):
        return None
    return SandboxNetwork(str(raw["netns"]), tuple(str(ip) for ip in raw.get("ips") or ()),
                          bool(raw.get("ready")))


class Store:
    def __init__(self, root: Path, compact_slack: int = COMPACT_SLACK) -> None:
        self.root = root
        self.containers_dir = root / "containers"
        self.containers_dir.mkdir(parents=True, exist_ok=True)
        self.journal = root / JOURNAL
        self.compact_slack = compact_slack
        self._containers = str(self.containers_dir)
        self._lock = threading.Lock()
        self._fd = -1
        self._lines: dict[str, bytes] = {}  # "s:<id>" / "c:<id>" -> its live record's line
        self._live_bytes = 0
        self._size = 0  # of the journal
        self._compact_next = False
        self._legacy: set[str] = set()  # containers whose monitor files are in <id>/
        self._loaded = False
        self.compactions = 0

    # --- paths of the monitor files ---
    def state_prefix(self, container_id: str) -> str:
        """What a monitor is handed: it writes ``<prefix>.started.json`` and
        ``<prefix>.exit.json``, and names the container by the prefix's last component."""
        return f"{self._containers}/{container_id}"

    def seccomp_path(self, container_id: str) -> str:
        return f"{self._containers}/{container_id}{SECCOMP}"

    def started_path(self, container_id: str) -> str:
        if container_id in self._legacy:
            return f"{self._containers}/{container_id}/started.json"
        return f"{self._containers}/{container_id}{STARTED}"

    def exit_path(self, container_id: str) -> str:
        if container_id in self._legacy:
            return f"{self._containers}/{container_id}/exit.json"
        return f"{self._containers}/{container_id}{EXITED}"

    # --- the journal ---
    def _append(self, key: str, record: dict[str, Any], live: bool) -> None:
        """Record one change; ``live``: ``record`` is now the whole record of ``key`` (else
        ``key`` is gone). Raises StoreError when it could not be written."""
        line = _line(record)
        with self._lock:
            if not self._loaded:  # a compaction would replace the journal with this line alone
                raise RuntimeError("Store.load() must run before the first change")
            old = self._lines.pop(key, None)
            if old is not None:
                self._live_bytes -= len(old)
            if live:
                self._lines[key] = line
                self._live_bytes += len(line)
            try:
                if (self._compact_next or self._fd < 0
                        or self._size + len(line) > 2 * self._live_bytes + self.compact_slack):
                    self._compact()
                else:
                    self._write(line)
            except OSError as err:
                # Undo in memory; the journal holds what it held (or a line the next
                # compaction drops): compact before the next append.
                self._compact_next = True
                if live:
                    self._live_bytes -= len(self._lines.pop(key))
                if old is not None:
                    self._lines[key] = old
                    self._live_bytes += len(old)
                raise StoreError(f"cannot write {self.journal}: {err.strerror} "
                                 f"(errno {err.errno})") from None

    def _write(self, line: bytes) -> None:
        written = os.write(self._fd, line)
        if written != len(line):  # a short write on a full disk: the tail is torn
            raise OSError(errno.ENOSPC, "short write to the journal")
        self._size += written

    def _compact(self) -> None:
        tmp = f"{self.journal}.tmp"
        body = b"".join(self._lines.values())
        write_new(tmp, body)
        new = os.open(tmp, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            os.rename(tmp, self.journal)
        except OSError:
            os.close(new)
            raise
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._size, self._compact_next = new, len(body), False
        self.compactions += 1

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    # --- sandboxes ---
    def save_sandbox(self, sb: Sandbox) -> None:
        """A new sandbox, or a sandbox whose state changed."""
        self._append(f"s:{sb.id}", _sandbox_record(sb), live=True)

    def delete_sandbox(self, sandbox_id: str) -> None:
        self._append(f"s:{sandbox_id}", {"op": "sandbox_del", "id": sandbox_id}, live=False)

    # --- containers ---
    def save_container(self, c: Container, spec: bytes) -> None:
        """``spec``: what the monitor runs (JSON text: argv, env, cwd, log_path)."""
        self._append(f"c:{c.id}", {
            "op": "container", "id": c.id, "sandbox_id": c.sandbox_id,
            "config": _b64(c.config.SerializeToString()), "spec": spec.decode(),
            "created_at": c.created_at, "log_path": c.log_path, "image_ref": c.image_ref,
        }, live=True)

    def save_start(self, container_id: str, monitor_pid: int, monitor_ticks: int) -> None:
        """The intent of a start: the container goes to the monitor (pid, start ticks) next.
        Raises StoreError (then nothing may be sent)."""
        self._append(f"t:{container_id}", {"op": "start", "id": container_id,
                                           "monitor": [monitor_pid, monitor_ticks]}, live=True)

    def delete_container(self, container_id: str) -> None:
        """The line first: a runtime killed before the unlinks leaves files the next load
        removes, never a container without its files."""
        self._append(f"c:{container_id}", {"op": "container_del", "id": container_id},
                     live=False)
        with self._lock:  # its start intent goes with it (the replay drops it too)
            intent = self._lines.pop(f"t:{container_id}", None)
            if intent is not None:
                self._live_bytes -= len(intent)
        for path in (self.started_path(container_id), self.exit_path(container_id),
                     self.seccomp_path(container_id)):
            with contextlib.suppress(OSError):
                os.unlink(path)
        if container_id in self._legacy:
            shutil.rmtree(f"{self._containers}/{container_id}", ignore_errors=True)
            self._legacy.discard(container_id)

    def save_exit(self, container_id: str, info: ExitInfo) -> None:
        write_json_atomic(self.exit_path(container_id), {
            "exit_code": info.exit_code, "finished_at": info.finished_at,
            "reason": info.reason, "message": info.message,
        })

    def read_started(self, container_id: str) -> StartInfo | None:
        """None when absent or unreadable (= not started, as before the monitor wrote it)."""
        data = _read_json(self.started_path(container_id))
        try:
            return None if data is None else StartInfo(
                int(data["monitor_pid"]), int(data["monitor_ticks"] or 0), int(data["pid"]),
                int(data["pid_ticks"] or 0), int(data["started_at"]))
        except (KeyError, ValueError, TypeError):
            return None

    def read_exit(self, container_id: str) -> ExitInfo | None:
        """None when absent or unreadable (the runtime then decides the exit itself)."""
        data = _read_json(self.exit_path(container_id))
        try:
            return None if data is None else ExitInfo(
                int(data["exit_code"]), int(data["finished_at"]), str(data["reason"]),
                str(data.get("message", "")))
        except (KeyError, ValueError, TypeError):
            return None

    # --- load ---
    def load(self) -> Loaded:
        """Replay the journal, import the previous layout if any, and rewrite the journal from
        what was loaded (dropping a torn tail). Raises nothing: what it cannot read is in
        ``problems``, and a journal it cannot rewrite is rewritten at the next change."""
        out = Loaded()
        sandboxes: dict[str, Sandbox] = {}
        records: dict[str, dict[str, Any]] = {}  # container id -> its journal record
        intents: dict[str, dict[str, Any]] = {}  # container id -> its last start's record
        self._replay(sandboxes, records, intents, out)
        imported = self._import_legacy(sandboxes, records, out)
        for cid, rec in records.items():
            try:
                config = pb.ContainerConfig.FromString(base64.b64decode(rec["config"]))
                out.containers.append(Container(
                    cid, str(rec["sandbox_id"]), config, int(rec["created_at"]),
                    str(rec["log_path"]), str(rec["image_ref"]),
                    self.read_started(cid), self.read_exit(cid)))
                out.specs[cid] = str(rec["spec"]).encode()
            except (ValueError, TypeError, KeyError) as err:
                out.problems.append(f"container {cid}: bad record, skipped: {err}")
        loaded = {c.id for c in out.containers}
        intents = {cid: rec for cid, rec in intents.items() if cid in loaded}
        out.starting = {cid: (int(rec["monitor"][0]), int(rec["monitor"][1]))
                        for cid, rec in intents.items()}
        out.sandboxes = list(sandboxes.values())
        with self._lock:
            self._lines = {f"s:{sb.id}": _line(_sandbox_record(sb)) for sb in out.sandboxes}
            self._lines.update((f"c:{c.id}", _line(records[c.id])) for c in out.containers)
            self._lines.update((f"t:{cid}", _line(rec)) for cid, rec in intents.items())
            self._live_bytes = sum(len(line) for line in self._lines.values())
            self._loaded = True
            try:
                self._compact()
            except OSError as err:
                self._compact_next = True
                out.problems.append(f"cannot rewrite {self.journal}: {err}")
                imported = []
        for path in imported:  # now in the journal
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        self._sweep({c.id for c in out.containers})
        return out

    def _replay(self, sandboxes: dict[str, Sandbox], records: dict[str, dict[str, Any]],
                intents: dict[str, dict[str, Any]], out: Loaded) -> None:
        try:
            data = self.journal.read_bytes()
        except FileNotFoundError:
            return
        except OSError as err:
            out.problems.append(f"{self.journal}: {err}")
            return
        for number, raw in enumerate(data.split(b"\n"), 1):
            if not raw:
                continue
            try:
                rec = json.loads(raw)
                op, key = rec["op"], str(rec["id"])
                if op == "sandbox":
                    config = pb.PodSandboxConfig.FromString(base64.b64decode(rec["config"]))
                    sandboxes[key] = Sandbox(key, config, int(rec["created_at"]),
                                             SandboxState(rec["state"]), str(rec["handler"]),
                                             _sandbox_network(rec.get("net")))
                elif op == "sandbox_del":
                    sandboxes.pop(key, None)
                elif op == "container":
                    missing = [name for name in CONTAINER_FIELDS if name not in rec]
                    if missing:
                        raise ValueError(f"container record without {', '.join(missing)}")
                    records[key] = rec
                elif op == "container_del":
                    records.pop(key, None)
                    intents.pop(key, None)
                elif op == "start":
                    pid, ticks = rec["monitor"]
                    if not isinstance(pid, int) or not isinstance(ticks, int) or pid <= 0:
                        raise ValueError(f"start record with monitor {rec['monitor']!r}")
                    intents[key] = rec
                else:
                    raise ValueError(f"unknown op {op!r}")
            except (ValueError, KeyError, TypeError) as err:
                out.problems.append(f"{self.journal} line {number}: {err}; "
                                    "the lines after it are ignored")
                return

    def _import_legacy(self, sandboxes: dict[str, Sandbox],
                       records: dict[str, dict[str, Any]], out: Loaded) -> list[Path]:
        """Returns what to remove once the journal holds the imported records (a crash before
        that imports them again: same result)."""
        imported: list[Path] = []
        old = self.root / "sandboxes"
        if old.is_dir():
            for d in old.iterdir():
                meta = _read_json(d / "meta.json")
                try:
                    config = pb.PodSandboxConfig.FromString((d / "config.pb").read_bytes())
                    if meta is not None and d.name not in sandboxes:
                        sandboxes[d.name] = Sandbox(
                            d.name, config, int(meta["created_at"]),
                            SandboxState(meta["state"]), str(meta["runtime_handler"]))
                except (OSError, ValueError, KeyError, TypeError) as err:
                    out.problems.append(f"{d}: not imported: {err}")
            out.notes.append(f"imported {old} into {self.journal}")
            imported.append(old)
        for d in self.containers_dir.iterdir():
            if not d.is_dir():
                continue
            if d.name in records:  # imported before: only its monitor files are left
                self._legacy.add(d.name)
                continue
            meta = _read_json(d / "meta.json")
            try:
                config = (d / "config.pb").read_bytes()
                spec = (d / "spec.json").read_text(encoding="utf-8")
                if meta is None:
                    raise ValueError("no meta.json (a create that never finished)")
                records.setdefault(d.name, {
                    "op": "container", "id": d.name, "sandbox_id": str(meta["sandbox_id"]),
                    "config": _b64(config), "spec": spec,
                    "created_at": int(meta["created_at"]), "log_path": str(meta["log_path"]),
                    "image_ref": str(meta["image_ref"])})
                self._legacy.add(d.name)
            except (OSError, ValueError, KeyError, TypeError) as err:
                out.problems.append(f"{d}: not imported: {err}")
                shutil.rmtree(d, ignore_errors=True)
                continue
            imported += [d / "meta.json", d / "config.pb", d / "spec.json"]
        return imported

    def _sweep(self, known: set[str]) -> None:
        """Remove monitor files of containers the journal does not know."""
        with os.scandir(self._containers) as entries:
            for entry in entries:
                cid = entry.name.split(".", 1)[0]
                if cid not in known and not entry.is_dir():
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
