"""supervisord's PROCESS_LOG_STDOUT / PROCESS_LOG_STDERR events (parent type PROCESS_LOG), for
the processes whose output events are enabled (off by default, as in supervisord):

- a subsystem: ``supervision.processes.NAME.stdoutEventsEnabled: true`` (supervisord's
  ``stdout_events_enabled``). Its one log file ``logs/NAME.log`` is its whole output (stderr
  redirected into it, as ``getAllConfigInfo``'s ``redirect_stderr`` says), so it yields
  PROCESS_LOG_STDOUT; ``stderrEventsEnabled`` on a subsystem yields nothing (supervisord with
  ``redirect_stderr=true`` has no stderr channel either).
- a container: the pod annotations ``ops.podvisor.io/stdout-events-enabled: "true"`` and
  ``ops.podvisor.io/stderr-events-enabled: "true"`` (every container of the pod); its CRI log
  file tags every line with its stream, so each channel yields its own type.

``LogTap`` follows those log files (``logtail.LogFollower``, from their end when the tap
starts following: only new output makes events, as supervisord only sees output while it
runs) and turns appended output into ``(event type, payload)``: the payload is supervisord's
``ProcessLogEvent.payload()``, ``processname:N groupname:G pid:P channel:C`` then a newline and
the data. One event per channel per poll carries the complete lines read (supervisord sends
each chunk it read from the pipe); a container's partial (``P``) CRI lines are joined into the
line they continue. A container that restarts writes a new file: the tap follows it from its
start. Pure over files: no clock, no sockets (``Listener.on_time`` polls it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from podvisor.common import crilog
from podvisor.ipc.maps import DesiredPod
from podvisor.services.ops.logtail import TRUNCATED, LogFollower
from podvisor.services.ops.procs import AGENT_GROUP, Proc

__all__ = ["STDERR_ANNOTATION", "STDOUT_ANNOTATION", "LogSource", "LogTap", "agent_sources",
           "container_sources", "events_enabled", "log_payload", "wants_logs"]

STDOUT_ANNOTATION = "ops.podvisor.io/stdout-events-enabled"
STDERR_ANNOTATION = "ops.podvisor.io/stderr-events-enabled"
STDOUT, STDERR = "stdout", "stderr"
EVENT_OF = {STDOUT: "PROCESS_LOG_STDOUT", STDERR: "PROCESS_LOG_STDERR"}
MAX_EVENT = 65536  # bytes of data per event (a longer read is split)


def wants_logs(events: Iterable[str]) -> bool:
    """Whether a listener's subscription covers a PROCESS_LOG type."""
    return any(e in ("EVENT", "PROCESS_LOG", *EVENT_OF.values()) for e in events)


def log_payload(name: str, group: str, pid: int, channel: str, data: str) -> str:
    """supervisord's ``ProcessLogEvent.payload()``."""
    return f"processname:{name} groupname:{group} pid:{pid} channel:{channel}\n{data}"


@dataclass(frozen=True)
class LogSource:
    """One process whose output makes events."""

    group: str
    name: str
    pid: int
    path: str
    cri: bool  # a CRI log (stream-tagged lines) rather than a plain one
    channels: frozenset[str]

    @property
    def namespec(self) -> str:
        return f"{self.group}:{self.name}"


def _truthy(raw: object) -> bool:
    return str(raw).strip().lower() in ("true", "1", "yes")


def events_enabled(proc: Proc, processes: Mapping[str, Mapping[str, Any]],
                   desired: Mapping[str, object]) -> tuple[bool, bool]:
    """``(stdout_events_enabled, stderr_events_enabled)`` of one process, as
    ``getAllConfigInfo`` reports them: a subsystem's spec, a container's pod annotations."""
    if proc.kind != "container":
        spec = processes.get(proc.name, {})
        return bool(spec.get("stdout_events_enabled")), bool(spec.get("stderr_events_enabled"))
    entry = desired.get(str(proc.extra.get("uid", "")))
    notes = entry.annotations if isinstance(entry, DesiredPod) else {}
    return (_truthy(notes.get(STDOUT_ANNOTATION, "")), _truthy(notes.get(STDERR_ANNOTATION, "")))


def agent_sources(processes: Mapping[str, Mapping[str, Any]], pids: Mapping[str, int],
                  logs_dir: str) -> list[LogSource]:
    """The subsystems whose ``stdoutEventsEnabled`` is set (``processes``: the validated
    ``supervision.processes`` partials)."""
    return [LogSource(AGENT_GROUP, name, int(pids.get(name, 0)),
                      os.path.join(logs_dir, f"{name}.log"), False, frozenset({STDOUT}))
            for name, spec in processes.items() if spec.get("stdout_events_enabled")]


def container_sources(desired: Mapping[str, object], procs: Iterable[Proc]) -> list[LogSource]:
    """The containers of the pods annotated for events, from their ``Proc``s."""
    channels: dict[str, frozenset[str]] = {}
    for uid, entry in desired.items():
        notes = entry.annotations if isinstance(entry, DesiredPod) else {}
        on = frozenset(c for c, key in ((STDOUT, STDOUT_ANNOTATION), (STDERR, STDERR_ANNOTATION))
                       if _truthy(notes.get(key, "")))
        if on:
            channels[uid] = on
    return [LogSource(p.group, p.name, p.pid, p.logfile, True, channels[str(p.extra["uid"])])
            for p in procs if p.kind == "container" and p.logfile
            and str(p.extra.get("uid")) in channels]


class _Tail:
    def __init__(self, source: LogSource, from_start: bool) -> None:
        self.source = source
        self.follower = LogFollower(source.path, 1 << 62 if from_start else 0)
        self.rest = b""  # an incomplete line
        self.partial: dict[str, bytes] = {}  # CRI: P-lines of a stream waiting for their F

    def read(self) -> dict[str, bytes]:
        """The complete output per channel appended since the last read."""
        out: dict[str, bytes] = {}
        while (data := self.follower.more()):
            if data is TRUNCATED:
                self.rest, self.partial = b"", {}
                continue
            lines = (self.rest + data).split(b"\n")
            self.rest = lines.pop()
            for line in lines:
                self._line(line, out)
        return out

    def _line(self, line: bytes, out: dict[str, bytes]) -> None:
        if not self.source.cri:
            out[STDOUT] = out.get(STDOUT, b"") + line + b"\n"
            return
        parsed = crilog.parse_line(line)
        if parsed is None:
            return
        stream, text, full = parsed
        if not full:
            self.partial[stream] = self.partial.get(stream, b"") + text
            return
        out[stream] = out.get(stream, b"") + self.partial.pop(stream, b"") + text + b"\n"

    def close(self) -> None:
        self.follower.close()


class LogTap:
    """Follows the sources' files; ``poll()`` -> the events their new output makes."""

    def __init__(self) -> None:
        self.tails: dict[str, _Tail] = {}
        self.started = False

    def update(self, sources: Iterable[LogSource]) -> None:
        """The current sources: new ones are followed (from their end on the first call, from
        their start after: a new container's file), a moved file is followed anew, gone ones
        dropped."""
        now = {s.namespec: s for s in sources if os.path.isfile(s.path)}
        for spec in [s for s in self.tails if s not in now]:
            self.tails.pop(spec).close()
        for spec, src in now.items():
            tail = self.tails.get(spec)
            if tail is None or tail.source.path != src.path:
                if tail is not None:
                    tail.close()
                try:
                    self.tails[spec] = _Tail(src, from_start=self.started)
                except OSError:
                    continue
            else:
                tail.source = src  # a new pid, channels
        self.started = True

    def poll(self) -> list[tuple[str, str]]:
        events: list[tuple[str, str]] = []
        for tail in self.tails.values():
            src = tail.source
            for channel, data in tail.read().items():
                if channel not in src.channels:
                    continue
                for i in range(0, len(data), MAX_EVENT):
                    text = data[i:i + MAX_EVENT].decode("utf-8", errors="replace")
                    events.append((EVENT_OF[channel],
                                   log_payload(src.name, src.group, src.pid, channel, text)))
        return events

    def close(self) -> None:
        for tail in self.tails.values():
            tail.close()
        self.tails.clear()
