"""``/containerLogs/{namespace}/{pod}/{container}`` on the main port, from the CRI log files.

The runtime writes ``<rootDir>/pod-logs/<namespace>_<name>_<uid>/<container>/<restartCount>.log``,
one record per line: ``<RFC3339Nano> <stdout|stderr> <F|P> <message>`` (P = partial, joined with
the records that follow up to the F). The pod is found by namespace and name; when several UIDs
left logs, the one the sync loop wants now (the ``desired`` map) wins, else the newest. The
newest file is the current instance, the one before it ``previous``.

Query parameters (the kubelet's ``PodLogOptions``): ``follow``, ``tailLines`` (>= 0),
``sinceSeconds`` (> 0) or ``sinceTime`` (RFC 3339; not both), ``limitBytes`` (> 0),
``previous``, ``timestamps`` (each line prefixed by its record's RFC3339Nano time). Bad values
are a 400 naming the parameter. ``follow`` streams new lines as they are written, until the
client goes away, the byte limit is reached, or the container restarts (a newer file appears:
this instance is over). An instance's lines are read across its rotated files
(``podvisor.common.crilog``, the reader ``podvisorctl logs`` uses), ``.gz`` ones included.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from podvisor.common.crilog import MAX_READ, read_tail, rotated_files
from podvisor.common.timefmt import parse_rfc3339

__all__ = [
    "Decoder",
    "LogLine",
    "LogOptions",
    "LogRequestError",
    "find_container_files",
    "parse_options",
    "serve_logs",
]

POLL = 0.1  # seconds between reads of a followed file


class LogRequestError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class LogLine:
    timestamp: bytes  # as written (RFC3339Nano)
    when: float  # epoch seconds (0.0 when the record is malformed)
    text: bytes  # the message, ending in \n


class Decoder:
    """Bytes of a CRI log file in, complete lines (P records joined per stream) out."""

    def __init__(self) -> None:
        self._partial: dict[bytes, tuple[bytes, float, bytes]] = {}
        self._rest = b""

    def feed(self, data: bytes) -> list[LogLine]:
        data = self._rest + data
        *records, self._rest = data.split(b"\n")
        out: list[LogLine] = []
        for rec in records:
            parts = rec.split(b" ", 3)
            if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr"):
                out.append(LogLine(b"", 0.0, rec + b"\n"))
                continue
            stamp, stream, tags = parts[0], parts[1], parts[2].split(b":")
            msg = parts[3] if len(parts) == 4 else b""
            try:
                when = parse_rfc3339(stamp.decode("ascii"))
            except (ValueError, UnicodeDecodeError):
                when = 0.0
            first = self._partial.pop(stream, None)
            if first is not None:
                stamp, when, msg = first[0], first[1], first[2] + msg
            if b"P" in tags:
                self._partial[stream] = (stamp, when, msg)
                continue
            out.append(LogLine(stamp, when, msg + b"\n"))
        return out


@dataclass(frozen=True)
class LogOptions:
    follow: bool = False
    tail_lines: int | None = None
    since: float | None = None  # epoch seconds
    limit_bytes: int | None = None
    previous: bool = False
    timestamps: bool = False


_KNOWN = {"follow", "tailLines", "sinceSeconds", "sinceTime", "limitBytes", "previous",
          "timestamps", "container", "insecureSkipTLSVerifyBackend", "pretty"}


def _bool(name: str, value: str) -> bool:
    low = value.lower()
    if low in ("", "true", "1"):
        return True
    if low in ("false", "0"):
        return False
    raise LogRequestError(400, "BadRequest", f"{name}: expected true or false, got {value!r}")


def _int(name: str, value: str, minimum: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise LogRequestError(400, "BadRequest",
                              f"{name}: expected an integer, got {value!r}") from None
    if number < minimum:
        raise LogRequestError(400, "BadRequest", f"{name}: must be >= {minimum}, got {number}")
    return number


def parse_options(query: Mapping[str, str], wall_now: float) -> LogOptions:
    unknown = sorted(set(query) - _KNOWN)
    if unknown:
        raise LogRequestError(400, "BadRequest",
                              f"unexpected query parameters: {', '.join(unknown)}")
    since: float | None = None
    if "sinceSeconds" in query and "sinceTime" in query:
        raise LogRequestError(400, "BadRequest", "sinceSeconds and sinceTime: give one, not both")
    if "sinceSeconds" in query:
        since = wall_now - _int("sinceSeconds", query["sinceSeconds"], 1)
    if "sinceTime" in query:
        try:
            since = parse_rfc3339(query["sinceTime"])
        except ValueError:
            raise LogRequestError(400, "BadRequest", "sinceTime: expected an RFC 3339 time "
                                  f"like 2024-01-02T15:04:05Z, got {query['sinceTime']!r}"
                                  ) from None
    return LogOptions(
        follow=_bool("follow", query.get("follow", "false")),
        tail_lines=_int("tailLines", query["tailLines"], 0) if "tailLines" in query else None,
        since=since,
        limit_bytes=_int("limitBytes", query["limitBytes"], 1) if "limitBytes" in query
        else None,
        previous=_bool("previous", query.get("previous", "false")),
        timestamps=_bool("timestamps", query.get("timestamps", "false")),
    )


def _restart_files(container_dir: Path) -> list[Path]:
    found: list[tuple[int, Path]] = []
    try:
        for entry in os.scandir(container_dir):
            stem, dot, ext = entry.name.partition(".")
            if dot and ext == "log" and stem.isdigit():
                found.append((int(stem), Path(entry.path)))
    except OSError:
        return []
    return [p for _, p in sorted(found)]


def find_container_files(pod_logs: Path, namespace: str, name: str, container: str,
                         desired_uids: Callable[[], set[str]]) -> list[Path]:
    """The container's log files, oldest restart first. Raises ``LogRequestError`` (404)."""
    prefix = f"{namespace}_{name}_"
    try:
        dirs = [Path(e.path) for e in os.scandir(pod_logs)
                if e.name.startswith(prefix) and e.is_dir()]
    except OSError:
        dirs = []
    if not dirs:
        raise LogRequestError(404, "NotFound", f"pod {namespace}/{name} not found (no logs)")
    wanted = desired_uids()
    current = [d for d in dirs if d.name[len(prefix):] in wanted]

    def mtime(d: Path) -> float:
        try:
            return d.stat().st_mtime
        except OSError:
            return 0.0

    pod_dir = (current or sorted(dirs, key=mtime))[-1]
    files = _restart_files(pod_dir / container)
    if not files:
        raise LogRequestError(404, "NotFound",
                              f"container {container} in pod {namespace}/{name} not found "
                              "(no log yet)")
    return files


def _render(line: LogLine, opts: LogOptions) -> bytes:
    if opts.timestamps and line.timestamp:
        return line.timestamp + b" " + line.text
    return line.text


class _Writer:
    def __init__(self, response: web.StreamResponse, limit: int | None) -> None:
        self.response = response
        self.left = limit

    async def write(self, data: bytes) -> bool:
        """False once the byte limit is reached."""
        if self.left is not None:
            data = data[:self.left]
            self.left -= len(data)
        if data:
            await self.response.write(data)
        return self.left is None or self.left > 0


async def serve_logs(request: web.Request, files: list[Path], opts: LogOptions,
                     stopping: Callable[[], bool]) -> web.StreamResponse:
    if opts.previous:
        if len(files) < 2:
            raise LogRequestError(400, "BadRequest",
                                  "previous terminated container not found (no earlier "
                                  "instance of this container left a log)")
        path, follow = files[-2], False
    else:
        path, follow = files[-1], opts.follow
    loop = asyncio.get_running_loop()
    decoder = Decoder()

    def read_start() -> tuple[list[LogLine], int]:
        # the instance's rotated files (``<n>.log.<stamp>[.gz]``, oldest first), then its file
        lines: list[LogLine] = []
        for older in rotated_files(path):
            try:
                lines += decoder.feed(read_tail(older, MAX_READ)[0])
            except (OSError, EOFError):
                continue  # removed by the rotation meanwhile: skip it
        data, end = read_tail(path, MAX_READ)
        return lines + decoder.feed(data), end

    try:
        lines, offset = await loop.run_in_executor(None, read_start)
    except OSError as exc:
        raise LogRequestError(404, "NotFound", f"cannot read {path.name}: {exc}") from None
    if opts.since is not None:
        since = opts.since
        lines = [ln for ln in lines if ln.when >= since]
    if opts.tail_lines is not None:
        lines = lines[-opts.tail_lines:] if opts.tail_lines > 0 else []
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await response.prepare(request)
    out = _Writer(response, opts.limit_bytes)
    more = await out.write(b"".join(_render(ln, opts) for ln in lines))
    if not follow:
        await response.write_eof()
        return response
    try:
        with path.open("rb") as src:
            src.seek(offset)
            while more and not stopping():
                data = src.read(1 << 20)
                if data:
                    fresh = decoder.feed(data)
                    if opts.since is not None:
                        fresh = [ln for ln in fresh if ln.when >= opts.since]
                    more = await out.write(b"".join(_render(ln, opts) for ln in fresh))
                    continue
                if _restart_files(path.parent)[-1:] != [path]:
                    break  # the container restarted: this instance's log is complete
                await asyncio.sleep(POLL)
        await response.write_eof()
    except OSError:  # ConnectionResetError included
        pass  # the client went away (or the file did): nothing left to answer
    return response

