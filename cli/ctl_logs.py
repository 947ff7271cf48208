"""`podvisorctl logs POD [CONTAINER] [--follow] [--tail N]` and the `events` table.

Logs are read straight from the CRI log files the runtime writes (the agent need not run):
`<rootDir>/pod-logs/<namespace>_<name>_<uid>/<container>/<restartCount>.log`, one record per
line, `<RFC3339Nano> <stdout|stderr> <F|P> <message>` (P = partial; joined with the records
that follow, up to the F). POD is `name` or `namespace/name`; a static pod's manifest name
(`web` for the pod `web-<nodeName>`) is accepted too. When several pods of that name left
logs (an edited manifest gives a new UID), the one the sync loop wants now (`desired` map)
wins, else the newest. Only the newest `restartCount` is shown; `--follow` keeps printing new
records, and moves on to the next file when the container restarts, until Ctrl-C.
Exit codes: 0 ok (or Ctrl-C), 1 unknown pod/container or no log yet.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from podvisor.common.config import read_config_json
from podvisor.common.crilog import MAX_READ, read_tail, with_rotated
from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.maps import DESIRED
from podvisor.ipc.paths import RunPaths

__all__ = ["CriDecoder", "LogError", "find_log_dir", "format_events", "main_logs",
           "tail_lines"]

POLL = 0.1  # seconds between checks of a followed file
MAX_TAIL_READ = MAX_READ


class LogError(Exception):
    """Unknown pod or container, or no log yet (exit code 1)."""


# --- CRI log records ---


class CriDecoder:
    """Bytes of a CRI log file in, complete log lines out (P records joined per stream).
    A malformed record is passed through as it is (it is still the container's output)."""

    def __init__(self) -> None:
        self._partial: dict[bytes, bytes] = {}
        self._rest = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Every complete line in ``data`` (plus what was left over), each ending in \\n."""
        data = self._rest + data
        *records, self._rest = data.split(b"\n")
        out: list[bytes] = []
        for rec in records:
            parts = rec.split(b" ", 3)
            if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr"):
                out.append(rec + b"\n")
                continue
            stream, tags = parts[1], parts[2].split(b":")
            msg = parts[3] if len(parts) == 4 else b""
            if b"P" in tags:
                self._partial[stream] = self._partial.get(stream, b"") + msg
                continue
            out.append(self._partial.pop(stream, b"") + msg + b"\n")
        return out


def tail_lines(files: list[Path], count: int | None) -> list[bytes]:
    """The decoded lines of ``files`` (oldest first, rotated ``.gz`` ones included), only the
    last ``count`` if given."""
    dec = CriDecoder()
    lines: list[bytes] = []
    for f in files:
        try:
            lines += dec.feed(read_tail(f, MAX_TAIL_READ)[0])
        except (OSError, EOFError):
            continue
    if count is not None:
        lines = lines[-count:] if count > 0 else []
    return lines


# --- finding the files ---


@dataclass(frozen=True)
class PodDir:
    namespace: str
    name: str
    uid: str
    path: Path


def _pod_dirs(pod_logs: Path) -> list[PodDir]:
    try:
        entries = list(os.scandir(pod_logs))
    except OSError:
        return []
    out = []
    for e in entries:
        parts = e.name.split("_", 2)
        if len(parts) == 3 and e.is_dir():
            out.append(PodDir(parts[0], parts[1], parts[2], Path(e.path)))
    return out


def _match(dirs: list[PodDir], pod: str, node_name: str) -> list[PodDir]:
    ns, _, name = pod.rpartition("/")
    for wanted in (name, f"{name}-{node_name}" if node_name else ""):
        hits = [d for d in dirs if wanted and d.name == wanted and (not ns or d.namespace == ns)]
        if hits:
            return hits
    return []


def _desired_uids(paths: RunPaths) -> set[str]:
    import zmq

    from podvisor.ipc.clone import MapReplica

    zctx: zmq.Context[Any] = zmq.Context()
    try:
        replica = MapReplica(zctx, paths, DESIRED, snapshot_timeout=1.0, clock=SYSTEM_CLOCK)
        try:
            return set(replica.items()) if replica.sync() else set()
        finally:
            replica.close()
    except Exception:
        return set()
    finally:
        zctx.destroy(linger=0)


def find_log_dir(root: Path, pod: str, container: str | None,
                 desired: Callable[[], set[str]] | None = None) -> Path:
    """The container's log directory. Raises ``LogError`` naming what is missing."""
    paths = RunPaths(root)
    try:
        node_name = read_config_json(paths.config_json).node_name
    except (OSError, ValueError):
        node_name = ""
    hits = _match(_pod_dirs(paths.pod_logs_dir), pod, node_name)
    if not hits:
        raise LogError(f'pod "{pod}" not found (no logs under {paths.pod_logs_dir})')
    if len(hits) > 1:
        wanted = (desired or (lambda: _desired_uids(paths)))()
        current = [h for h in hits if h.uid in wanted]
        hits = current or sorted(hits, key=lambda h: _mtime(h.path))
    chosen = hits[-1]
    names = sorted(e.name for e in chosen.path.iterdir() if e.is_dir())
    if container is None:
        if len(names) == 1:
            return chosen.path / names[0]
        if not names:
            raise LogError(f'pod "{chosen.namespace}/{chosen.name}" has no container logs yet')
        raise LogError(f'a container name must be specified for pod "{chosen.name}", choose '
                       f"one of: [{' '.join(names)}]")
    if container not in names:
        raise LogError(f'container "{container}" is not valid for pod "{chosen.name}" '
                       f"(containers with logs: [{' '.join(names)}])")
    return chosen.path / container


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def _restart_of(name: str) -> int | None:
    stem = name.removesuffix(".log")
    return int(stem) if name.endswith(".log") and stem.isdigit() else None


def latest_log(cdir: Path) -> tuple[int, Path] | None:
    """(restartCount, path) of the newest ``<n>.log`` in a container's log directory."""
    try:
        found = [(n, cdir / e) for e in os.listdir(cdir) if (n := _restart_of(e)) is not None]
    except OSError:
        return None
    return max(found) if found else None


# --- following ---


def follow(cdir: Path, start: tuple[int, Path], offset: int, out: IO[bytes],
           stop: Callable[[], bool], sleep: Callable[[float], None] = time.sleep) -> None:
    """Print records appended to ``start``'s file from ``offset`` on; when a newer restart's
    file appears, finish this one and go on with that one from its start. A truncated or
    replaced file (rotation) is read again from its start."""
    restart, path = start
    dec = CriDecoder()
    ino = _inode(path)
    while not stop():
        data = b""
        try:
            with path.open("rb") as src:
                st = os.fstat(src.fileno())
                if st.st_ino != ino or st.st_size < offset:
                    ino, offset = st.st_ino, 0
                src.seek(offset)
                data = src.read()
                offset += len(data)
        except OSError:
            pass
        if lines := dec.feed(data):
            out.write(b"".join(lines))
            out.flush()
        newer = latest_log(cdir)
        if newer is not None and newer[0] > restart and not data:
            restart, path = newer
            ino, offset, dec = _inode(path), 0, CriDecoder()
            continue
        if not data:
            sleep(POLL)


def _inode(p: Path) -> int:
    try:
        return p.stat().st_ino
    except OSError:
        return -1


def main_logs(root_dir: str, pod: str, container: str | None, follow_: bool,
              tail: int | None, out: IO[bytes] | None = None,
              stop: Callable[[], bool] = lambda: False) -> int:
    out = out or sys.stdout.buffer
    if tail is not None and tail < 0:
        tail = None  # kubectl: -1 = everything
    try:
        cdir = find_log_dir(Path(root_dir), pod, container)
        latest = latest_log(cdir)
        if latest is None:
            raise LogError(f"no log file yet in {cdir}")
    except LogError as exc:
        print(f"podvisorctl: {exc}", file=sys.stderr)
        return 1
    try:
        out.write(b"".join(tail_lines(with_rotated(latest[1]), tail)))
        out.flush()
        if follow_:
            follow(cdir, latest, _size(latest[1]), out, stop)
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:  # `| head`: stop quietly (Python docs, "Note on SIGPIPE")
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 0


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


# --- events ---


def format_events(result: dict[str, Any], now: float | None = None) -> str:
    """The `kubectl get events` table: LAST SEEN, TYPE, REASON, OBJECT, MESSAGE."""
    from podvisor.common.timefmt import parse_rfc3339

    now = SYSTEM_CLOCK.wall() if now is None else now
    rows = [("LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE")]
    for e in result.get("items", []):
        try:
            secs = max(0, int(now - parse_rfc3339(e["lastTimestamp"])))
            age = next((f"{secs // s}{u}" for u, s in (("d", 86400), ("h", 3600), ("m", 60))
                        if secs >= s), f"{secs}s")
        except (KeyError, ValueError):
            age = "<unknown>"
        obj = e.get("involvedObject", {})
        what = obj.get("name") or obj.get("file") or obj.get("url") or obj.get("uid", "")
        count = f" (x{e['count']})" if e.get("count", 1) > 1 else ""
        rows.append((age, e.get("type", ""), e.get("reason", ""),
                     f"{str(obj.get('kind', '')).lower()}/{what}", e.get("message", "") + count))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True))
                     + "   " + r[4] for r in rows)
