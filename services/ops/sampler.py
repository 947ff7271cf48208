"""The charts' sampling: CPU and memory of every subsystem, pod and container, every
``interval`` (5 s), into a ``UsageStore``, with restarts and faults as marks.

Where the figures come from (what podvisor already reads):

- a subsystem: the supervisor's view of its children: its pid (the control ``status`` rows,
  asked at start and every ``RESEED``; between those, the ``supervisor.process.state``
  messages the ops process receives), then that process's ``/proc/<pid>/stat`` (user + system
  time, resident pages: one read). Its own process only: the runtime's container monitors
  and an event listener's command are not counted in it.
- a container: CRI ``ListContainerStats`` (one call for all: the cumulative
  ``usageCoreNanoSeconds`` and the working set; the rate is taken here between two of our own
  samples, as ``podvisorctl top`` does, so another caller of the runtime does not skew it);
  a pod is the sum of its containers.
- the node's pressure conditions (``pressure.py``): ``/proc/meminfo``, ``statvfs`` of
  ``rootDir``, ``/proc/loadavg``, ``pid_max``.

Marks: a subsystem's fault (RUNNING or STARTING -> BACKOFF/EXITED/FATAL: the exit signal or
code and reason) and restart (RUNNING again under a new pid) at the message's own time; a
container's fault (its last termination, exit code not 0) and restart (its running
``startedAt`` after a restart count that grew) at the times its status gives.

Threads: ``on_state`` runs on the service loop (main thread), ``sample`` on a worker thread
(it blocks on the CRI call), ``take_frame`` and ``history`` on any; one lock.
"""

from __future__ import annotations

import math
import os
import signal
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from podvisor.common.labels import POD_NAME, POD_NAMESPACE
from podvisor.common.service import ServiceLoop
from podvisor.common.timefmt import parse_rfc3339
from podvisor.ipc.clock import Clock
from podvisor.ipc.control import ProcessRow, ProcessState
from podvisor.ipc.maps import PodStatusValue
from podvisor.ipc.messages import ProcessStateChanged
from podvisor.services.cri import CriError, RuntimeClient
from podvisor.services.ops.pressure import NodeReadings, conditions
from podvisor.services.ops.usage import Mark, Sample, UsageStore, cpu_millis, frame_of, sum_pods

__all__ = ["INTERVAL", "ProcReader", "Sampler", "follow_states", "read_node", "read_proc"]

INTERVAL = 5.0
RESEED = 60.0  # ask the supervisor for the pids again (bus messages are hints)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
FAULT_STATES = frozenset({"BACKOFF", "EXITED", "FATAL"})
LIVE_STATES = frozenset({"RUNNING", "STARTING"})

ProcReader = Callable[[int], tuple[int, int] | None]  # pid -> (CPU ns, RSS bytes)


def read_proc(pid: int) -> tuple[int, int] | None:
    """(user + system CPU ns, resident bytes) of one process; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()
    try:  # fields from the state (3rd) on: utime 14, stime 15, rss 24
        ticks = int(fields[11]) + int(fields[12])
        return ticks * 1_000_000_000 // CLOCK_TICKS, int(fields[21]) * PAGE
    except (IndexError, ValueError):
        return None


def read_node(root_dir: Path) -> NodeReadings:
    info: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in ("MemTotal", "MemAvailable"):
                info[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        st = os.statvfs(root_dir if root_dir.exists() else "/")
        fs = (st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize, st.f_favail, st.f_files)
    except OSError:
        fs = (0, 0, 0, 0)
    try:
        pids = int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError, IndexError):
        pids, pid_max = 0, 0
    return NodeReadings(info.get("MemAvailable", 0), info.get("MemTotal", 0), *fs, pids, pid_max)


def _exit_text(code: int | None, sig: int | None, reason: str) -> str:
    if sig:
        try:
            what = signal.Signals(sig).name
        except ValueError:
            what = f"signal {sig}"
    else:
        what = f"exit {code if code is not None else '?'}"
    return f"{what} ({reason})" if reason else what


class Sampler:
    def __init__(self, store: UsageStore, cri: Callable[[], RuntimeClient],
                 statuses: Callable[[], Mapping[str, Any]],
                 status_rows: Callable[[], Iterable[ProcessRow]], clock: Clock,
                 root_dir: Path, read_proc: ProcReader = read_proc,
                 read_node: Callable[[Path], NodeReadings] = read_node,
                 held: Callable[[], Collection[str]] = lambda: ()) -> None:
        """``statuses``: the ``statuses`` replica's mapping now; ``status_rows``: the control
        ``status`` rows (blocking); ``held``: the pressure conditions the eviction manager
        holds True now (its ``pressure`` map)."""
        self.store, self._cri, self._statuses = store, cri, statuses
        self._status_rows, self.clock, self.root_dir = status_rows, clock, root_dir
        self._read_proc, self._read_node, self._held = read_proc, read_node, held
        self._lock = threading.Lock()
        self._pids: dict[str, int] = {}  # subsystem -> pid (0: not running)
        self._seen: dict[str, int] = {}  # subsystem -> the last pid it ran under
        self._prev: dict[str, tuple[float, int]] = {}  # "agent:NAME@pid" / container id
        self._pending: list[Mark] = []  # marks not yet in a frame
        self._seeded = -math.inf
        self._statuses_seen: Mapping[str, Any] | None = None
        self._restarts: dict[str, int] = {}  # container key -> restart count seen
        self.pressure: list[dict[str, Any]] = []
        self.errors = 0  # samples whose CRI call failed (the subsystems still sampled)

    # -- marks -------------------------------------------------------------------------
    def _mark(self, mark: Mark) -> None:
        self.store.mark(mark)
        self._pending.append(mark)

    def on_state(self, msg: ProcessStateChanged) -> None:
        """A subsystem's state change (service loop thread): its pid, and a mark."""
        key = f"agent:{msg.name}"
        t = msg.ts or self.clock.wall()
        with self._lock:
            if msg.to_state == "RUNNING" and msg.pid:
                before = self._seen.get(msg.name)
                if before is not None and before != msg.pid:
                    self._mark(Mark(t, key, "restart", f"restart {msg.restarts}"))
                self._seen[msg.name] = msg.pid
            if msg.to_state in FAULT_STATES and msg.from_state in LIVE_STATES:
                self._mark(Mark(t, key, "fault",
                                _exit_text(msg.exit_code, msg.exit_signal, msg.reason)))
            self._pids[msg.name] = (msg.pid or 0) if msg.to_state in LIVE_STATES else 0

    def _seed(self, now: float) -> None:
        if now < self._seeded + RESEED:
            return
        try:
            rows = list(self._status_rows())
        except Exception:  # the agent does not answer: keep what the messages said
            return
        self._seeded = now
        with self._lock:
            for row in rows:
                pid = row.pid or 0
                self._pids[row.name] = pid if row.state.name in LIVE_STATES else 0
                if pid and row.state is ProcessState.RUNNING:
                    self._seen.setdefault(row.name, pid)

    def _container_marks(self) -> None:
        """Restarts and faults of containers, from the statuses (when that map moved)."""
        statuses = self._statuses()
        if statuses is self._statuses_seen:
            return
        self._statuses_seen = statuses
        for value in statuses.values():
            if not isinstance(value, PodStatusValue):
                continue
            ref = value.pod
            group = f"{ref.namespace or 'default'}.{ref.name}"
            for cs in value.status.container_statuses:
                key = f"{group}:{cs.name}"
                count = cs.restart_count
                before = self._restarts.get(key)
                self._restarts[key] = count
                if before is None or count <= before:
                    continue
                last = cs.last_state.terminated
                if last is not None and last.exit_code and last.finished_at:
                    self._mark(Mark(_time(last.finished_at, self.clock), key, "fault",
                                    _exit_text(last.exit_code, None, last.reason)))
                running = cs.state.running
                started = running.started_at if running is not None else None
                t = _time(started, self.clock) if started else self.clock.wall()
                self._mark(Mark(t, key, "restart", f"restart {count}"))

    # -- sampling ----------------------------------------------------------------------
    def sample(self) -> Sample:
        """One sample of everything (blocking: a control call now and then, one CRI call, a
        read per subsystem); stored, and its marks kept for the next frame."""
        now = self.clock.monotonic()
        self._seed(now)
        wall = self.clock.wall()
        values: dict[str, tuple[int, int]] = {}
        with self._lock:
            pids = dict(self._pids)
        prev, fresh = self._prev, dict[str, tuple[float, int]]()
        for name, pid in pids.items():
            if not pid:
                continue
            got = self._read_proc(pid)
            if got is None:
                continue
            slot = f"agent:{name}@{pid}"
            fresh[slot] = (now, got[0])
            values[f"agent:{name}"] = (cpu_millis(prev.get(slot), fresh[slot]) or 0,
                                       got[1] >> 10)
        try:
            stats = self._cri().list_container_stats()
        except CriError:
            stats = []
            self.errors += 1
        for st in stats:
            labels = st.attributes.labels
            if POD_NAME not in labels or not st.HasField("cpu"):
                continue
            key = (f"{labels.get(POD_NAMESPACE) or 'default'}.{labels[POD_NAME]}:"
                   f"{st.attributes.metadata.name}")
            cid = st.attributes.id
            fresh[cid] = (st.cpu.timestamp / 1e9, st.cpu.usage_core_nano_seconds.value)
            mem = st.memory.working_set_bytes.value if st.HasField("memory") else 0
            cpu = cpu_millis(prev.get(cid), fresh[cid]) or 0
            old = values.get(key)  # two records of one name: an old one still listed
            values[key] = (cpu + (old[0] if old else 0), (mem >> 10) + (old[1] if old else 0))
        values.update(sum_pods(values))
        self._prev = fresh
        pressure = conditions(self._read_node(self.root_dir), self._held())
        sample = Sample(wall, values)
        with self._lock:
            self._container_marks()
            self.pressure = pressure
            self.store.add(sample)
        return sample

    def take_frame(self, sample: Sample) -> dict[str, Any]:
        """The live feed's ``usage`` event for ``sample``: with the marks made since the last
        frame and the node's pressure conditions."""
        with self._lock:
            marks, self._pending = self._pending, []
            return frame_of(sample, marks, {"pressure": self.pressure})

    def history(self) -> dict[str, Any]:
        with self._lock:
            return {**self.store.history(), "pressure": self.pressure}


def _time(text: object, clock: Clock) -> float:
    try:
        return parse_rfc3339(str(text))
    except ValueError:
        return clock.wall()


def follow_states(loop: ServiceLoop, on_state: Callable[[ProcessStateChanged], object]) -> None:
    """A subscriber of the supervisor's process state messages on ``loop`` (its own socket:
    the map pump's only counts them) handing each to ``on_state``."""
    sub = loop.subscriber([ProcessStateChanged.TOPIC])

    def drain() -> None:
        while (env := sub.recv(0)) is not None:
            if isinstance(env.message, ProcessStateChanged):
                on_state(env.message)

    loop.watch(sub.socket, drain)
