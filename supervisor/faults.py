"""The faults in force (issue 28): the supervisor's table of injected faults.

``inject`` gives a validated ``FaultSpec`` (``ipc/faults.py``) an id (``f1``, ``f2``, ...),
applies what the supervisor applies itself (``kill``: the signal, at once and once; ``stop``:
SIGSTOP now, SIGCONT at the end), records an event, and rewrites ``run/faults/faults.json``, from
which every process takes the faults aimed at it (``common/faultwatch.py``) and applies them
through its own seams. ``expire(now)`` ends the faults whose duration ran out (the loop calls it
and wakes for ``next_expiry()``); ``clear`` ends one or all at once. Each end is an event too
(``FaultCleared``, with how long it lasted and why it ended), so ``podvisorctl events`` shows
every fault's start and end. The file is emptied when the agent starts and when it stops.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from podvisor.common.logs import EventLog
from podvisor.ipc.faults import POD_PREFIX, ROOT_DIR_TARGET, ActiveFault, FaultSpec, write_faults
from podvisor.ipc.messages import Event
from podvisor.supervisor.core import Supervisor
from podvisor.supervisor.diskfault import DiskFault, StateFault, VolumeMount
from podvisor.supervisor.eventstore import EventStore
from podvisor.supervisor.stress import StressChild, cgroups_of

__all__ = ["FaultTable"]

INSTANT = ("kill",)  # applied once, at once: in force for no time
# a pod's emptyDir (NAME, VOLUME) -> its host path and its mounts in the pod's containers
PodVolume = Callable[[str, str], "tuple[Path, list[VolumeMount]] | None"]


@dataclass
class _Entry:
    fault: ActiveFault
    ends_at: float | None  # monotonic
    pid: int | None = None  # stop: the incarnation that was stopped
    stress: StressChild | None = None  # resource: the child pressing
    disk: DiskFault | StateFault | None = None  # disk: the filesystems mounted


class FaultTable:
    """One thread (the supervisor's loop)."""

    def __init__(self, sup: Supervisor, path: Path, events: EventStore | None, log: EventLog,
                 clock: Callable[[], float], wall: Callable[[], float],
                 pod_cgroups: Callable[[str], list[Path]] = lambda pod: [],
                 pod_volume: PodVolume | None = None, state_dir: Path | None = None) -> None:
        """``pod_cgroups(name)``: the cgroups of a running pod's container (resource faults
        on ``pod/NAME``); [] when it has none. ``pod_volume(name, volume)``: an emptyDir's
        host path and its mounts in the pod's containers (disk faults). ``state_dir``: the
        node's state (disk faults on ``rootDir``; their mounts are made beside ``path``)."""
        self._state_dir = state_dir
        self._sup = sup
        self._pod_cgroups = pod_cgroups
        self._pod_volume = pod_volume
        self._path = path
        self._events = events
        self._log = log
        self._clock = clock
        self._wall = wall
        self._entries: dict[str, _Entry] = {}
        self._next = 1
        self._write()

    def active(self) -> list[ActiveFault]:
        return [e.fault for e in self._entries.values()]

    def inject(self, spec: FaultSpec) -> ActiveFault:
        """Apply ``spec`` (its target known to be a process). Raises ProcessLookupError when a
        signal cannot be delivered (the process is not running)."""
        fid = f"f{self._next}"
        wall = self._wall()
        timed = spec.duration and spec.kind not in INSTANT
        fault = ActiveFault(fid, spec, wall, wall + spec.duration if timed else None)
        entry = _Entry(fault, self._clock() + spec.duration if timed else None)
        if spec.kind == "kill":
            self._sup.kill(spec.target, signal.Signals[f"SIG{spec.signal}"])
        elif spec.kind == "stop":
            entry.pid = self._sup.kill(spec.target, signal.SIGSTOP).pid
        elif spec.kind == "resource":
            entry.stress = StressChild(spec.action, spec.amount, self._cgroups(spec.target))
        elif spec.kind == "disk":
            entry.disk = self._disk(spec, fid)
        self._next += 1
        self._record("Warning", "FaultInjected", fault,
                     f"{fid} {spec.describe()}"
                     + (f" for {spec.duration:g}s" if timed else
                        "" if spec.kind in INSTANT else " until cleared"))
        self._log.warning("fault.injected", fault=fid, kind=spec.kind, target=spec.target,
                          what=spec.describe(), duration=spec.duration)
        if spec.kind in INSTANT:
            self._record("Normal", "FaultCleared", fault, f"{fid} {spec.describe()}: done")
            return fault
        self._entries[fid] = entry
        self._write()
        return fault

    def clear(self, fid: str | None = None) -> list[ActiveFault]:
        """End fault ``fid`` (None: every fault); the faults ended."""
        ids = list(self._entries) if fid is None else [fid] if fid in self._entries else []
        return self._end(ids, "cleared")

    def expire(self) -> list[ActiveFault]:
        now = self._clock()
        return self._end([fid for fid, e in self._entries.items()
                          if e.ends_at is not None and e.ends_at <= now], "expired")

    def next_expiry(self) -> float | None:
        return min((e.ends_at for e in self._entries.values() if e.ends_at is not None),
                   default=None)

    def _end(self, ids: list[str], why: str) -> list[ActiveFault]:
        ended = []
        for fid in ids:
            entry = self._entries.pop(fid)
            spec = entry.fault.spec
            if spec.kind == "stop":
                self._resume(spec.target, entry.pid)
            if entry.stress is not None:
                entry.stress.stop()
            if entry.disk is not None:
                entry.disk.end()
            lasted = self._wall() - entry.fault.started
            self._record("Normal", "FaultCleared", entry.fault,
                         f"{fid} {spec.describe()}: {why} after {lasted:.1f}s")
            self._log.info("fault.cleared", fault=fid, kind=spec.kind, target=spec.target,
                           why=why, lasted=round(lasted, 3))
            ended.append(entry.fault)
        if ended:
            self._write()
        return ended

    def _cgroups(self, target: str) -> list[Path]:
        """Where a stress child goes: a subsystem's cgroups (none of its own: the agent's,
        where the child already is), or a pod's (LookupError when it has none)."""
        if target.startswith(POD_PREFIX):
            found = self._pod_cgroups(target.removeprefix(POD_PREFIX))
            if not found:
                raise LookupError(f"no cgroup of pod {target.removeprefix(POD_PREFIX)!r} (not "
                                  "running, or its runtime runs it without cgroups)")
            return found
        proc = self._sup.procs[target]
        if proc.pid is None or not proc.alive:
            raise ProcessLookupError(f"{target} is not running")
        return cgroups_of(proc.pid)

    def _disk(self, spec: FaultSpec, fid: str) -> DiskFault | StateFault:
        if spec.target == ROOT_DIR_TARGET:
            if self._state_dir is None:
                raise LookupError("this agent has no state directory to fault")
            if any(e.fault.spec.kind == "disk" and e.fault.spec.target == ROOT_DIR_TARGET
                   for e in self._entries.values()):
                raise LookupError(f"a disk fault on {ROOT_DIR_TARGET} is in force already")
            return StateFault(self._state_dir, self._path.parent / f"disk-{fid}", spec.action,
                              spec.amount)
        pod, _, volume = spec.target.removeprefix(POD_PREFIX).rpartition("/")
        found = None if self._pod_volume is None else self._pod_volume(pod, volume)
        if found is None or not found[1]:
            raise LookupError(f"no emptyDir {volume!r} mounted in a running container of pod "
                              f"{pod!r}")
        return DiskFault(found[0], found[1], spec.action, spec.amount)

    def _resume(self, name: str, pid: int | None) -> None:
        """SIGCONT the incarnation that was stopped, if it still runs (a replacement never was
        stopped)."""
        proc = self._sup.procs.get(name)
        if proc is None or pid is None or proc.pid != pid or not proc.alive:
            return
        with contextlib.suppress(ProcessLookupError):
            self._sup.kill(name, signal.SIGCONT)

    def _record(self, kind: str, reason: str, fault: ActiveFault, message: str) -> None:
        if self._events is None:
            return
        wall = self._wall()
        self._events.add(Event(type=kind, reason=reason, message=message,
                               object={"kind": "Fault", "name": fault.id,
                                       "fieldPath": fault.spec.target},
                               source="supervisor", first_ts=wall, last_ts=wall))
        # kept now, not at the loop's next drain of bus events (the store's next deadline is
        # the interval after its last write: there must be one)
        self._events.persist()

    def _write(self) -> None:
        try:
            write_faults(self._path, self.active())
        except OSError as exc:
            self._log.error("fault.file_failed", file=str(self._path), error=str(exc))

    def close(self) -> None:
        """The agent stops: resume what was stopped, and leave no fault in force on disk."""
        self.clear()
