"""The processes the ops port shows, as supervisord's ``getProcessInfo`` structs (pure).

Two kinds: the agent's subsystems (group ``agent``, from the supervisor's ``status`` rows) and
the pods' containers (group ``<namespace>.<pod name>``, from the ``desired`` map's typed pods
and the ``statuses`` and ``pleg`` maps). ``Proc`` keeps what the actions need beside the public
``info`` struct, whose keys are exactly supervisord's (``name``, ``group``, ``start``, ``stop``,
``now``, ``state``, ``statename``, ``spawnerr``, ``exitstatus``, ``logfile``, ``stdout_logfile``,
``stderr_logfile``, ``pid``, ``description``).
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from podvisor.ipc.control import ProcessRow, ProcessState
from podvisor.ipc.maps import (
    DesiredPod,
    DesiredValue,
    PlegContainer,
    PlegPod,
    PlegValue,
    PodStatusValue,
)
from podvisor.ipc.podstatus import ContainerState, ContainerStatus, Running, Terminated, Waiting
from podvisor.services.ops.states import container_state
from podvisor.services.pod import PodValidationError, WirePods

__all__ = ["AGENT_GROUP", "Proc", "agent_procs", "describe", "pod_group", "pod_procs",
           "split_namespec"]

AGENT_GROUP = "agent"
XMLRPC_MAXINT = 2**31 - 1


def capped(value: float) -> int:
    """supervisord's ``capped_int``: XML-RPC ints are 32-bit."""
    return max(-(2**31), min(XMLRPC_MAXINT, int(value)))


def split_namespec(namespec: str) -> tuple[str, str | None]:
    """supervisord's ``split_namespec``: ``group:name`` -> (group, name); ``group:*`` and
    ``group:`` -> (group, None); ``name`` -> (name, name)."""
    group, sep, name = namespec.partition(":")
    if not sep:
        return namespec, namespec
    return group, (name if name not in ("", "*") else None)


def pod_group(namespace: str, name: str) -> str:
    """A pod's process group name: ``<namespace>.<name>`` (a namespace has no dots)."""
    return f"{namespace}.{name}"


@dataclass(frozen=True)
class Proc:
    """One process as the ops port sees it."""

    group: str
    name: str
    kind: str  # "agent" | "container"
    state: ProcessState
    pid: int
    start: float  # wall seconds (0: never started)
    stop: float
    exitstatus: int
    spawnerr: str
    logfile: str
    restarts: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)  # container id, pod uid, ...
    # a container's: the exit code of each exited runtime container of its name by ID (a
    # restart's old container is found here while the status may not speak of it yet), and
    # the status's lastState exit code
    exits: Mapping[str, int] = field(default_factory=dict)
    last_exit_code: int | None = None

    @property
    def namespec(self) -> str:
        return f"{self.group}:{self.name}"

    def info(self, now: float) -> dict[str, Any]:
        """supervisord's ``getProcessInfo`` struct, key for key."""
        out: dict[str, Any] = {
            "name": self.name, "group": self.group, "start": capped(self.start),
            "stop": capped(self.stop), "now": capped(now), "state": int(self.state),
            "statename": self.state.name, "spawnerr": self.spawnerr,
            "exitstatus": self.exitstatus, "logfile": self.logfile,
            "stdout_logfile": self.logfile, "stderr_logfile": "", "pid": self.pid,
        }
        out["description"] = describe(out)
        return out


def describe(info: Mapping[str, Any]) -> str:
    """supervisord's ``_interpretProcessInfo``."""
    state = info["state"]
    if state == ProcessState.RUNNING:
        uptime = datetime.datetime(*time.gmtime(info["now"])[:6]) - datetime.datetime(
            *time.gmtime(info["start"])[:6])
        if uptime.total_seconds() < 0:
            uptime = datetime.timedelta(0)
        return f"pid {info['pid']}, uptime {uptime}"
    if state in (ProcessState.FATAL, ProcessState.BACKOFF):
        return str(info["spawnerr"]) or f'unknown error (try "tail {info["name"]}")'
    if state in (ProcessState.STOPPED, ProcessState.EXITED):
        if info["start"]:
            stop = datetime.datetime(*time.localtime(info["stop"])[:7])
            return stop.strftime("%b %d %I:%M %p")
        return "Not started"
    return ""


def agent_procs(rows: Iterable[ProcessRow], now: float, logs_dir: Path) -> list[Proc]:
    """The ``agent`` group from the supervisor's ``status`` rows (``now``: wall seconds)."""
    out = []
    for row in rows:
        last = row.last_exit
        start = now - row.uptime if row.uptime is not None else (
            last.time - last.ran_for if last is not None else 0.0)
        spawnerr = row.reason if row.state in (ProcessState.BACKOFF, ProcessState.FATAL) else ""
        out.append(Proc(
            group=AGENT_GROUP, name=row.name, kind="agent", state=row.state,
            pid=row.pid or 0, start=max(0.0, start),
            stop=last.time if last is not None else 0.0,
            exitstatus=(last.code or 0) if last is not None else 0,
            spawnerr=spawnerr, logfile=str(logs_dir / f"{row.name}.log"),
            restarts=row.restarts,
            extra={"module": row.module, "reason": row.reason,
                   "lastExit": last.to_wire() if last is not None else None,
                   "heartbeatLate": row.heartbeat_late, "heartbeatAge": row.heartbeat_age}))
    return out


def _latest(containers: Iterable[PlegContainer]) -> dict[str, PlegContainer]:
    """The newest runtime container per container name (by attempt, then creation)."""
    out: dict[str, PlegContainer] = {}
    for c in containers:
        cur = out.get(c.name)
        if cur is None or (c.attempt, c.created_at) > (cur.attempt, cur.created_at):
            out[c.name] = c
    return out


def _embedded_pid(runtime_dir: Path | None, container_id: str) -> int:
    """The pid the embedded runtime's monitor recorded (0 when unknown or another runtime)."""
    if runtime_dir is None or not container_id:
        return 0
    try:
        data = json.loads((runtime_dir / "containers" / f"{container_id}.started.json")
                          .read_text(encoding="utf-8"))
        return int(data.get("pid") or 0)
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


_LIVE = (ProcessState.STARTING, ProcessState.RUNNING, ProcessState.STOPPING)


def _exits(containers: Iterable[PlegContainer]) -> dict[str, dict[str, int]]:
    """Per container name, the exit code of each exited runtime container by ID (a restart's
    old container is found here while the status may not speak of it yet)."""
    out: dict[str, dict[str, int]] = {}
    for c in containers:
        if c.state == "CONTAINER_EXITED":
            out.setdefault(c.name, {})[c.id] = c.exit_code
    return out


def _consistent(cs: ContainerStatus | None,
                rc: PlegContainer | None) -> ContainerStatus | None:
    """The container's status, or (when it speaks of an older container than the newest one
    PLEG lists, or says running of one PLEG saw exit: the two maps move separately) a status
    read from that newest runtime record, so a process's state, pid and restart count always
    belong to one and the same container, as the runtime last saw it."""
    if rc is None or not rc.id or cs is None:
        return cs
    exited = ContainerState(terminated=Terminated(exit_code=rc.exit_code))
    if cs.runtime_id == rc.id:
        if rc.state != "CONTAINER_EXITED" or cs.state.running is None:
            return cs
        return replace(cs, state=exited)
    if rc.state == "CONTAINER_RUNNING":
        state = ContainerState(running=Running())
    elif rc.state == "CONTAINER_EXITED":
        state = exited
    else:
        state = ContainerState(waiting=Waiting("ContainerCreating"))
    return replace(cs, state=state, restart_count=rc.restart_count)


def pod_procs(desired: Mapping[str, DesiredValue], statuses: Mapping[str, PodStatusValue],
              pleg: Mapping[str, PlegValue], runtime_dir: Path | None = None,
              pods: WirePods | None = None) -> list[Proc]:
    """One process per container of every desired pod (init containers included, first).
    ``pods``: the typed pods of ``desired``, kept between calls (a pod that is not a validated
    wire form, a bug upstream, shows no processes)."""
    pods = WirePods() if pods is None else pods
    out = []
    for uid, entry in desired.items():
        if not isinstance(entry, DesiredPod):
            continue
        try:
            pod = pods.get(uid, entry.pod)
        except PodValidationError:
            continue
        group = pod_group(pod.namespace or "default", pod.name)
        value = statuses.get(uid)
        by_name = {cs.name: cs for cs in (*value.status.init_container_statuses,
                                          *value.status.container_statuses)} if value else {}
        record = pleg.get(uid)
        listed = record.containers if isinstance(record, PlegPod) else ()
        runtime, exits = _latest(listed), _exits(listed)
        policy = str(pod.spec.restart_policy)
        for container in pod.all_containers():
            name = container.name
            rc = runtime.get(name)
            cs = _consistent(by_name.get(name), rc)
            code = rc.exit_code if rc is not None else 0
            terminal = policy == "Never" or (policy == "OnFailure" and code == 0)
            state = container_state(cs, terminal)
            cid = rc.id if rc is not None else ""
            waiting = cs.state.waiting if cs is not None else None
            spawnerr = " ".join(x for x in (waiting.reason, waiting.message) if x) \
                if waiting is not None else ""
            # supervisord gives a pid while the process lives (STARTING, RUNNING, STOPPING):
            # the runtime's record says so before the status catches up, and the status
            # before PLEG's record reached this process (the two maps move separately)
            live = rc.id if rc is not None and rc.state == "CONTAINER_RUNNING" else (
                cs.runtime_id if cs is not None and state is ProcessState.RUNNING else "")
            last = cs.last_state.terminated if cs is not None else None
            out.append(Proc(
                group=group, name=name, kind="container", state=state,
                pid=_embedded_pid(runtime_dir, live) if state in _LIVE and live else 0,
                start=rc.started_at / 1e9 if rc is not None else 0.0,
                stop=rc.finished_at / 1e9 if rc is not None else 0.0, exitstatus=code,
                spawnerr=spawnerr, logfile=rc.log_path if rc is not None else "",
                restarts=cs.restart_count if cs is not None else (
                    rc.restart_count if rc is not None else 0),
                extra={"uid": uid, "container_id": cid, "restartPolicy": policy,
                       "grace": pod.spec.termination_grace_period_seconds,
                       "image": container.image,
                       "command": [*container.command, *container.args]},
                exits=exits.get(name, {}),
                last_exit_code=last.exit_code if last is not None else None))
    return out
