"""An eventlistener process (``supervision.processes.<name>.kind: eventlistener``).

This process is the supervised one: it runs the configured ``command`` as its child (stdin and
stdout are the protocol's pipes; stderr goes to ``logs/<name>.listener.log``) with supervisord's
environment (``SUPERVISOR_SERVER_URL`` = the ops port, ``SUPERVISOR_USERNAME``/``PASSWORD``,
``SUPERVISOR_PROCESS_NAME``, ``SUPERVISOR_GROUP_NAME``, ``SUPERVISOR_ENABLED``), and feeds it
the subscribed ``events``: PROCESS_STATE_* of the subsystems (from the supervisor's
``supervisor.process.state`` messages) and of the containers (derived from the pod maps),
TICK_5/TICK_60/TICK_3600, and PROCESS_LOG_STDOUT/STDERR of the processes whose output events
are enabled (``logevents``; polled from ``Listener.on_time``). When the command exits, this
process exits 1 and the supervisor restarts both (crash back-off), as supervisord restarts a
dead listener.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
from collections.abc import Mapping
from typing import Any

from podvisor.common.child import ChildContext
from podvisor.common.config import ops_password_path
from podvisor.common.opspass import read_ops_password
from podvisor.common.service import ServiceLoop
from podvisor.ipc.control import ControlClient, ControlError
from podvisor.ipc.maps import DesiredValue, PlegValue, PodStatusValue
from podvisor.ipc.messages import ProcessStateChanged
from podvisor.services.ops.events import (
    Transition,
    agent_transitions,
    container_events,
    matches,
    payload,
)
from podvisor.services.ops.feeder import EventFeeder
from podvisor.services.ops.logevents import LogTap, agent_sources, container_sources, wants_logs
from podvisor.services.ops.procs import AGENT_GROUP, Proc, pod_procs
from podvisor.services.ops.pump import MapPump, PodMaps
from podvisor.services.pod import WirePods

TICKS = (("TICK_5", 5), ("TICK_60", 60), ("TICK_3600", 3600))
LOG_POLL = 0.2  # how often log files are looked at for PROCESS_LOG_* (when subscribed)


class ListenerExited(RuntimeError):
    pass


def _env(ctx: ChildContext) -> dict[str, str]:
    cfg = ctx.config
    env = dict(os.environ)
    scheme = "https" if cfg.ops_tls_cert_file else "http"
    env.update(SUPERVISOR_ENABLED="1", SUPERVISOR_PROCESS_NAME=ctx.name,
               SUPERVISOR_GROUP_NAME=ctx.name,
               SUPERVISOR_SERVER_URL=f"{scheme}://{cfg.ops_address}:{cfg.ops_port}")
    if cfg.ops_port:
        with contextlib.suppress(OSError, ValueError):
            env.update(SUPERVISOR_USERNAME=cfg.ops_username,
                       SUPERVISOR_PASSWORD=read_ops_password(ops_password_path(cfg)))
    return env


class Listener:
    """Turns bus messages, map snapshots and ticks into events for one feeder."""

    def __init__(self, feeder: EventFeeder, events: list[str],
                 runtime_dir: Any = None) -> None:
        self.feeder, self.events, self.runtime_dir = feeder, events, runtime_dir
        self.crashed: set[str] = set()
        self.containers: Mapping[str, Proc] | None = None
        self.ticks = {name: 0 for name, _ in TICKS}
        # PROCESS_LOG_* (``enable_logs``): the tap, the subsystems' specs, their pids
        self.logs: LogTap | None = None
        self.log_specs: Mapping[str, Mapping[str, Any]] = {}
        self.logs_dir = ""
        self.pids: dict[str, int] = {}
        self.desired: Mapping[str, DesiredValue] = {}

    def enable_logs(self, processes: Mapping[str, Mapping[str, Any]], logs_dir: str,
                    pids: Mapping[str, int]) -> None:
        """Produce PROCESS_LOG_* (see ``logevents``): ``processes`` are the validated
        ``supervision.processes`` specs, ``pids`` the subsystems' pids now (``on_state`` keeps
        them); ``on_time`` then also polls the log files, every ``LOG_POLL``."""
        self.logs, self.log_specs, self.logs_dir = LogTap(), processes, logs_dir
        self.pids.update(pids)

    def on_logs(self) -> None:
        """Events for what the followed log files gained (called by ``on_time``)."""
        if self.logs is None:
            return
        sources = agent_sources(self.log_specs, self.pids, self.logs_dir)
        if self.containers is not None:
            sources += container_sources(self.desired, self.containers.values())
        self.logs.update(sources)
        for name, body in self.logs.poll():
            if matches(self.events, name):
                self.feeder.push(name, body)

    def _emit(self, tr: Transition) -> None:
        if matches(self.events, tr.event):
            self.feeder.push(tr.event, payload(tr))

    def on_state(self, msg: ProcessStateChanged) -> None:
        prev_crash = msg.name in self.crashed
        self.pids[msg.name] = (msg.pid or 0) if msg.to_state in ("STARTING", "RUNNING") else 0
        for tr in agent_transitions(AGENT_GROUP, msg.name, msg.from_state, msg.to_state,
                                    msg.pid or 0, msg.exit_code, msg.restarts, prev_crash):
            self._emit(tr)
        if (msg.from_state, msg.to_state) in (("RUNNING", "BACKOFF"), ("STOPPING", "BACKOFF")):
            self.crashed.add(msg.name)
        elif msg.to_state != "BACKOFF":
            self.crashed.discard(msg.name)

    def on_maps(self, desired: Mapping[str, DesiredValue], statuses: Mapping[str, PodStatusValue],
                pleg: Mapping[str, PlegValue], pods: WirePods | None = None) -> None:
        now = {p.namespec: p for p in pod_procs(desired, statuses, pleg, self.runtime_dir, pods)}
        self.desired = desired
        if self.containers is not None:  # the first snapshot is the baseline
            for tr in container_events(self.containers, now):
                self._emit(tr)
        self.containers = now

    def on_time(self, wall: float) -> float:
        """Emit the ticks whose boundary ``wall`` crossed (and poll the logs when enabled);
        returns when to be called next."""
        nxt = float("inf") if self.logs is None else wall + LOG_POLL
        self.on_logs()
        for name, period in TICKS:
            boundary = int(wall // period) * period
            if self.ticks[name] and boundary > self.ticks[name] and matches(self.events, name):
                self.feeder.push(name, f"when:{boundary}")
            self.ticks[name] = boundary
            nxt = min(nxt, boundary + period)
        return nxt


def _enable_logs(ctx: ChildContext, listener: Listener, events: list[str]) -> bool:
    """Turn PROCESS_LOG_* on when subscribed; True when the pod maps are needed for them."""
    if not wants_logs(events):
        return False
    pids: dict[str, int] = {}
    with contextlib.suppress(ControlError):
        rows = ControlClient(ctx.paths.control, 5.0, ctx.zctx).processes()
        pids = {row.name: row.pid or 0 for row in rows}
    listener.enable_logs(ctx.config.supervision.processes, str(ctx.paths.logs_dir), pids)
    return True


class ListenerService:
    """The harness: the command as a child, fed on the process's service loop (its stdout and
    the state messages are watched; the maps, the ticks and the next message are the loop's
    step). Built once from the context."""

    def __init__(self, ctx: ChildContext) -> None:
        self.ctx = ctx
        self.wall = ctx.clock.wall
        spec: Mapping[str, Any] = ctx.config.supervision.processes.get(ctx.name, {})
        events = [e for e in str(spec.get("events") or "EVENT").split(",") if e]
        self.feeder = EventFeeder(ctx.name)
        runtime_dir = ctx.paths.runtime_dir if ctx.config.runtime_endpoint == "embedded" else None
        self.listener = Listener(self.feeder, events, runtime_dir)
        self.loop = ServiceLoop(ctx)
        want_maps = any(e == "EVENT" or e.startswith("PROCESS_STATE") for e in events)
        want_maps = _enable_logs(ctx, self.listener, events) or want_maps  # PROCESS_LOG_*
        self.pump = MapPump(self.loop, self.on_maps) if want_maps else None
        self.sub = self.loop.subscriber([ProcessStateChanged.TOPIC], self.on_states)
        self.stderr = open(ctx.paths.logs_dir / f"{ctx.name}.listener.log", "ab")  # noqa: SIM115
        self.child = subprocess.Popen(shlex.split(str(spec.get("command", ""))),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self.stderr, env=_env(ctx))
        assert self.child.stdin is not None and self.child.stdout is not None
        self.stdin = self.child.stdin
        self.out_fd = self.child.stdout.fileno()
        os.set_blocking(self.out_fd, False)
        ctx.log.info("listener.started", command=spec.get("command"), events=events,
                     pid=self.child.pid)
        self.loop.watch(self.out_fd, self.on_out)
        self.next_tick = self.listener.on_time(self.wall())

    def on_maps(self, maps: PodMaps, changed: bool) -> None:
        if changed and maps.synced:
            self.listener.on_maps(maps.desired, maps.statuses, maps.pleg, maps.pods)

    def on_states(self) -> None:
        while (env := self.sub.recv(0)) is not None:
            if isinstance(env.message, ProcessStateChanged):
                self.listener.on_state(env.message)

    def on_out(self) -> None:
        data = b""
        with contextlib.suppress(BlockingIOError):
            data = os.read(self.out_fd, 65536)
        if not data:
            raise ListenerExited(f"listener command exited ({self.child.wait()})")
        self.feeder.feed(data)

    def step(self, now: float) -> float:
        if self.pump is not None:
            self.pump.drain(now)
        if self.wall() >= self.next_tick:
            self.next_tick = self.listener.on_time(self.wall())
        message = self.feeder.next_message()
        if message is not None:
            self.stdin.write(message)
            self.stdin.flush()
        if self.child.poll() is not None:
            raise ListenerExited(f"listener command exited ({self.child.returncode})")
        return now + max(0.0, self.next_tick - self.wall())

    def close(self) -> None:
        feeder, child = self.feeder, self.child
        self.ctx.log.info("listener.stopping", sent=feeder.sent, failed=feeder.failed,
                          dropped=feeder.dropped)
        self.loop.close()
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self.stderr.close()


def run(ctx: ChildContext) -> None:
    service = ListenerService(ctx)
    try:
        service.loop.run(service.step)
    finally:
        service.close()
