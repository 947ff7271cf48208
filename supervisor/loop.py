"""The supervisor's event loop: one thread, one `zmq.Poller` over everything that can happen.

Polled: the heartbeat PULL socket, the control ROUTER, a self-pipe that `signal.set_wakeup_fd`
writes signal numbers to (the Python handlers do nothing else), and one pidfd per child (readable
the instant it exits). The poll timeout is the nearest deadline from `Supervisor.tick()` (respawn,
heartbeat staleness, SIGKILL escalation) or a pending control reply, so nothing is polled slowly.
Signals become the same actions as control commands: SIGTERM/SIGINT -> shutdown, SIGHUP -> reload.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import zmq

from podvisor.common.config import (
    Config,
    ConfigError,
    config_to_mapping,
    node_shutdown_groups,
    write_config_json,
)
from podvisor.common.endpoint import cri_endpoint
from podvisor.common.logs import EventLog
from podvisor.ipc.bus import Publisher, Subscriber
from podvisor.ipc.control import ControlFault, Fault, ProcessState
from podvisor.ipc.messages import (
    AllPodsStopped,
    Event,
    NodeShutdownDone,
    ProcessHeartbeat,
    ProcessStateChanged,
    StopAllPods,
)
from podvisor.ipc.paths import RunPaths
from podvisor.supervisor.advice import start_advice, stop_pods_command
from podvisor.supervisor.control import ControlServer
from podvisor.supervisor.core import Supervisor
from podvisor.supervisor.diskfault import VolumeMount, volume_mounts
from podvisor.supervisor.eventstore import EventStore
from podvisor.supervisor.faults import FaultTable
from podvisor.supervisor.heartbeat import BEAT, Beat, BeatReader, decode_beat
from podvisor.supervisor.leftpods import count_running_pods, left_message
from podvisor.supervisor.nodewait import ASK_EVERY, NodeShutdownWait
from podvisor.supervisor.process import SupervisedProcess
from podvisor.supervisor.reconcile import apply_specs
from podvisor.supervisor.registry import ProcessSpec
from podvisor.supervisor.runonce import (
    INTERRUPTED,
    Report,
    driver_failed,
    read_report,
    results_path,
)
from podvisor.supervisor.states import StateChange
from podvisor.supervisor.stress import pod_cgroups, pod_uid

__all__ = ["Agent", "AgentParts"]

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# After draining `events.*` messages, the events socket is not polled for this long: a burst
# (two events per pod started) is read in batches, not one loop wake-up per message. An event
# after a quiet spell still wakes the loop at once; `events` requests drain the socket first.
EVENTS_COALESCE = 0.05


@dataclass
class AgentParts:
    """What the composition root (`app.py`) builds for the loop."""

    config: Config
    sup: Supervisor
    zctx: zmq.Context[zmq.Socket[bytes]]
    publisher: Publisher
    subscriber: Subscriber  # topics `syncloop.pods.stopped`, `nodeshutdown.node.done`
    log: EventLog
    logs_dir: Path
    config_json: Path
    heartbeat_endpoint: str
    reload_config: Callable[[], Config]
    resolve: Callable[[Config], tuple[ProcessSpec, ...]]
    clock: Callable[[], float]
    wall: Callable[[], float]
    events: EventStore | None = None  # the kept events (`podvisorctl events`)
    events_sub: Subscriber | None = None  # topic `events.`
    beats_dir: Path | None = None  # where children map their heartbeat files (`run/`)


def _noop_handler(signum: int, frame: FrameType | None) -> None:
    """Handlers only make the wakeup fd carry the signal number to the loop."""


class Agent:
    """Runs the loop; also the `CommandContext` control commands use."""

    def __init__(self, parts: AgentParts) -> None:
        self.p = parts
        self.sup = parts.sup
        self.logs_dir = parts.logs_dir
        self.started_at = parts.wall()
        self.control: ControlServer | None = None
        self.events = parts.events
        paths = RunPaths(Path(parts.config.root_dir))
        self.faults = FaultTable(parts.sup, paths.faults_file, parts.events, parts.log,
                                 parts.clock, parts.wall, self._pod_cgroups, self._pod_volume,
                                 paths.state_dir)
        self._pods_deadline: float | None = None  # waiting for AllPodsStopped until then
        self._pods_asked = 0.0  # when StopAllPods was last published (asked again each ASK_EVERY)
        self.node = NodeShutdownWait(parts.publisher.publish, parts.clock, parts.wall)
        self._pods_done = False  # AllPodsStopped came
        self._left_pods: str | None = None  # said on exit: pods left running, how to stop them
        self._runonce: Report | None = None  # RunOnce: the driver's report, once it is done
        self._heartbeats = parts.zctx.socket(zmq.PULL)
        self._heartbeats.setsockopt(zmq.LINGER, 0)
        self._heartbeats.bind(parts.heartbeat_endpoint)
        self._sig_r, self._sig_w = socket.socketpair()
        self.bad_beats = 0
        self._beats_drained = parts.clock()
        self._events_quiet_until = float("-inf")  # events socket not polled before this
        self._beat_files = None if parts.beats_dir is None else BeatReader(
            parts.beats_dir, 2 * parts.config.supervision.heartbeat_interval, clock=parts.clock)

    # --- CommandContext ----------------------------------------------------------------------

    def request_shutdown(self, pods: bool) -> None:
        """Stop every process (reverse start order). With `pods`, first ask the sync loop to
        stop every pod (`StopAllPods`) and wait for `AllPodsStopped`, at most
        `supervision.stopPodsTimeout`; asked again every ``ASK_EVERY`` until it answers (the
        bus drops a message a sync loop just restarted has not subscribed for yet, and the
        sync loop answers a repeat once its pods are stopped)."""
        if self.sup.shutting_down or self._pods_deadline is not None:
            return
        syncloop = self.sup.procs.get("syncloop")
        self.p.log.info("agent.shutdown", stop_pods=pods)
        self.faults.clear()  # a stopped process resumes (to stop), a cut bus heals
        if pods and syncloop is not None and syncloop.alive:
            self._ask_stop_pods()
            self._pods_deadline = self.p.clock() + self.p.config.supervision.stop_pods_timeout
            self._pods_done = False
            return
        self._count_left_pods()
        self.sup.begin_shutdown(self.p.config.supervision.shutdown_timeout)

    def _ask_stop_pods(self) -> None:
        self._pods_asked = self.p.clock()
        self.p.publisher.publish(StopAllPods(reason="agent shutdown", ts=self.p.wall()))

    def request_node_shutdown(self) -> None:
        """A graceful node shutdown (``podvisorctl shutdown --node``; SIGTERM/SIGINT with
        ``shutdownOnSignal``): ask ``nodeshutdown`` (``NodeShutdown``, again until it answers)
        and stop every process once it answers ``NodeShutdownDone`` (``nodewait.py``)."""
        if self.sup.shutting_down or self._pods_deadline is not None or self.node.waiting:
            return
        proc = self.sup.procs.get("nodeshutdown")
        if proc is None:
            raise ControlFault(Fault.NOT_AVAILABLE, "graceful node shutdown is off: set "
                               "shutdownGracePeriod (or shutdownGracePeriodByPodPriority)")
        self.p.log.info("agent.node_shutdown")
        self.faults.clear()
        self.node.ask(sum(g.seconds for g in node_shutdown_groups(self.p.config)))

    def _drain_bus(self) -> None:
        while (env := self.p.subscriber.recv(0)) is not None:
            if isinstance(env.message, AllPodsStopped):
                self.p.log.info("agent.pods_stopped", pods=env.message.pods)
                self._pods_done = True
            elif isinstance(env.message, NodeShutdownDone):
                self.node.answered = True
                if not self.sup.shutting_down:
                    self.p.log.info("agent.node_shutdown_done", pods=env.message.pods,
                                    trigger=env.message.trigger)

    def _check_node_shutdown(self) -> None:
        """``NodeShutdownDone`` (asked for, or after logind's PrepareForShutdown) stops the
        agent; so does the wait running out."""
        if self.sup.shutting_down or not self.node.due():
            return
        if self.node.timed_out:
            self.p.log.warning("agent.node_shutdown_timeout")
        self.sup.begin_shutdown(self.p.config.supervision.shutdown_timeout)

    def _count_left_pods(self) -> None:
        """Ask the runtime (still up: shutdown has not begun) how many pods stay running."""
        if "syncloop" not in self.sup.procs:
            return  # this agent manages no pods
        paths = RunPaths(Path(self.p.config.root_dir))
        count = count_running_pods(self.p.config, paths)
        self._left_pods = left_message(count, paths.root)
        self.p.log.info("agent.pods_left", pods=count)

    def _pod_cgroups(self, name: str) -> list[Path]:
        """The cgroups of a running pod's container (a resource fault's ``pod/NAME``)."""
        config = self.p.config
        paths = RunPaths(Path(config.root_dir))
        uid = pod_uid(cri_endpoint(config.runtime_endpoint, paths.cri_socket), name,
                      config.node_name)
        return pod_cgroups(uid) if uid else []

    def _pod_volume(self, name: str, volume: str) -> tuple[Path, list[VolumeMount]] | None:
        """A pod's emptyDir (the kubelet's layout under rootDir/pods) and its mounts in the
        pod's containers (a disk fault's ``pod/NAME/VOLUME``)."""
        config = self.p.config
        paths = RunPaths(Path(config.root_dir))
        uid = pod_uid(cri_endpoint(config.runtime_endpoint, paths.cri_socket), name,
                      config.node_name)
        if not uid:
            return None
        host = paths.pods_dir / uid / "volumes" / "kubernetes.io~empty-dir" / volume
        return (host, volume_mounts(uid, volume)) if host.is_dir() else None

    def _check_runonce(self) -> None:
        """RunOnce: once the driver returned (or went FATAL), take its report and stop."""
        if not self.p.config.run_once or self._runonce is not None or self.sup.shutting_down:
            return
        proc = self.sup.procs.get("runonce")
        if proc is None:
            return
        paths = RunPaths(Path(self.p.config.root_dir))
        if proc.state is ProcessState.EXITED:
            hint = f"stop them with `{stop_pods_command(paths.root)}`"
            self._runonce = read_report(results_path(paths), hint)
        elif proc.state is ProcessState.FATAL:
            self._runonce = driver_failed(proc.state.name)
        else:
            return
        self.p.log.info("agent.runonce_done", exit_code=self._runonce.exit_code,
                        summary=self._runonce.summary)
        self.request_shutdown(False)

    def _check_pods_stopped(self) -> None:
        self._drain_bus()
        self._check_node_shutdown()
        if self._pods_deadline is None:
            return
        done, self._pods_done = self._pods_done, False
        if not done and self._pods_asked + ASK_EVERY <= self.p.clock() < self._pods_deadline:
            self._ask_stop_pods()
        if not done and self.p.clock() >= self._pods_deadline:
            self.p.log.warning("agent.pods_stop_timeout",
                               timeout=self.p.config.supervision.stop_pods_timeout)
            self._count_left_pods()
            done = True
        if done:
            self._pods_deadline = None
            self.sup.begin_shutdown(self.p.config.supervision.shutdown_timeout)

    def reload(self) -> list[str]:
        try:
            config = self.p.reload_config()
            specs = self.p.resolve(config)
        except (ConfigError, OSError) as exc:
            self.p.log.error("agent.reload_failed", error=str(exc))
            raise ControlFault(Fault.CANT_REREAD, str(exc)) from None
        if config.root_dir != self.p.config.root_dir:
            self.p.log.warning("agent.reload_ignored", key="rootDir",
                               reason="a new rootDir needs an agent restart")
            raise ControlFault(Fault.CANT_REREAD, "rootDir cannot change without a restart")
        changes = self._config_changes(self.p.config, config)
        if self._beat_files is not None:
            # children started before the reload beat at the old interval, later ones at the
            # new one: a beat file is remapped only after the longer of the two
            self._beat_files.reopen_after = 2 * max(self.p.config.supervision.heartbeat_interval,
                                                    config.supervision.heartbeat_interval)
        self.p.config = config
        write_config_json(config, self.p.config_json)
        changes += apply_specs(self.sup, specs)
        self.p.log.info("agent.reloaded", changes=changes)
        return changes

    @staticmethod
    def _config_changes(old: Config, new: Config) -> list[str]:
        a, b = config_to_mapping(old), config_to_mapping(new)
        a.pop("supervision")
        b.pop("supervision")
        return [f"{k}: {a[k]!r} -> {b[k]!r} (seen by processes as they restart)"
                for k in a if a[k] != b[k]]

    # --- events ------------------------------------------------------------------------------

    def publish_change(self, change: StateChange) -> None:
        self.p.publisher.publish(ProcessStateChanged(
            name=change.name, from_state=change.from_state.name, to_state=change.to_state.name,
            pid=change.pid, restarts=change.restarts, exit_code=change.exit_code,
            exit_signal=change.exit_signal, reason=change.reason, ts=change.ts))
        self.p.log.info("process.state", process=change.name, pid=change.pid,
                        to=change.to_state.name, **{"from": change.from_state.name},
                        restarts=change.restarts, reason=change.reason)

    def publish_late(self, proc: SupervisedProcess, late: bool, age: float) -> None:
        """A process's heartbeat went late or came back (``CoreDeps.on_late``)."""
        self.p.publisher.publish(ProcessHeartbeat(name=proc.name, pid=proc.pid, late=late,
                                                  age=round(age, 3), ts=self.p.wall()))
        if not late:
            self.p.log.info("process.heartbeat_back", process=proc.name, pid=proc.pid)

    def _drain_events(self) -> None:
        sub, store = self.p.events_sub, self.events
        if sub is None or store is None:
            return
        for i in range(1000):  # bounded: the loop must come back to heartbeats and control
            env = sub.recv(0)
            if env is None:
                break
            if i == 0:
                self._events_quiet_until = self.p.clock() + EVENTS_COALESCE
            if isinstance(env.message, Event):
                store.add(env.message)
        store.persist()

    def _events_polled(self) -> bool:
        """Whether the loop polls the events socket now (see ``EVENTS_COALESCE``)."""
        return self.p.events_sub is not None and self.p.clock() >= self._events_quiet_until

    def _drain_heartbeats(self) -> None:
        self._beats_drained = self.p.clock()
        self._read_beat_files()
        while True:
            try:
                data = self._heartbeats.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            beat = decode_beat(data)
            if beat is None:
                self.bad_beats += 1
                continue
            self.sup.on_beat(beat)

    def _read_beat_files(self) -> None:
        """Beats written to the children's shared files (RUNNING ones: `ready` still comes
        over PUSH, so a STARTING process becomes RUNNING only once it imported its module)."""
        if self._beat_files is None:
            return
        for name, proc in self.sup.procs.items():
            pid = proc.pid
            if proc.state is ProcessState.RUNNING and pid is not None and \
                    self._beat_files.new_beat(name, pid):
                self.sup.on_beat(Beat(BEAT, name, pid, 0.0))

    def _drain_signals(self) -> None:
        try:
            data = self._sig_r.recv(512)
        except BlockingIOError:
            return
        for signum in data:
            if signum in (signal.SIGTERM, signal.SIGINT):
                self.p.log.info("agent.signal", signal=signal.Signals(signum).name)
                if self.p.config.shutdown_on_signal and "nodeshutdown" in self.sup.procs:
                    self.request_node_shutdown()
                else:
                    self.request_shutdown(self.p.config.stop_pods_on_exit)
            elif signum == signal.SIGHUP:
                self.p.log.info("agent.signal", signal="SIGHUP")
                # a failure is logged by reload(); the old config stays in force
                with contextlib.suppress(ControlFault):
                    self.reload()

    # --- the loop ----------------------------------------------------------------------------

    def _install_signals(self) -> None:
        self._sig_r.setblocking(False)
        self._sig_w.setblocking(False)
        signal.set_wakeup_fd(self._sig_w.fileno(), warn_on_full_buffer=False)
        for sig in HANDLED_SIGNALS:
            signal.signal(sig, _noop_handler)

    def _beats_due(self) -> float | None:
        """When queued heartbeats must be read: at once while a process is STARTING (its
        `ready` ends the start), else once per `heartbeatInterval`. Beats only move staleness
        deadlines (`heartbeatTimeout`, seconds away), so the loop does not wake for each of
        the ~1 beat per second per child; they wait in the PULL queue."""
        if any(p.state is ProcessState.STARTING for p in self.sup.procs.values()):
            return None
        return self._beats_drained + self.p.config.supervision.heartbeat_interval

    def _timeout_ms(self, control: ControlServer) -> int | None:
        self._check_pods_stopped()
        self._drain_heartbeats()  # before tick: staleness is judged on every beat received
        persist = self.events.next_deadline() if self.events is not None else None
        quiet = None if self._events_polled() else self._events_quiet_until
        self.faults.expire()
        asking = None if self._pods_deadline is None else min(
            self._pods_deadline, self._pods_asked + ASK_EVERY)
        deadlines = [d for d in (self.sup.tick(), control.next_deadline(), asking,
                                 self.node.next_deadline(),
                                 persist, self._beats_due(), quiet, self.faults.next_expiry())
                     if d is not None]
        if not deadlines:
            return None
        return max(0, int((min(deadlines) - self.p.clock()) * 1000) + 1)

    def run(self, control: ControlServer) -> int:
        """Start every enabled process and serve until shutdown completes. Returns 0 (RunOnce:
        the run's exit code)."""
        self.control = control
        self._install_signals()
        self.p.log.info("agent.started", pid=os.getpid(), root_dir=self.p.config.root_dir,
                        processes=list(self.sup.procs))
        if self.p.config.run_once:
            results_path(RunPaths(Path(self.p.config.root_dir))).unlink(missing_ok=True)
        self.sup.start_all()
        if not self.p.config.run_once:
            advice = start_advice(self.p.config, "syncloop" in self.sup.procs)
            print("\n".join(advice), file=sys.stderr, flush=True)
        while True:
            timeout = self._timeout_ms(control)
            control.check_pending(self.p.clock())
            if self.sup.shutdown_done:
                break
            poller = zmq.Poller()
            if self._beats_due() is None:
                poller.register(self._heartbeats, zmq.POLLIN)
            poller.register(control.socket, zmq.POLLIN)
            poller.register(self._sig_r.fileno(), zmq.POLLIN)
            if self._pods_deadline is not None or "nodeshutdown" in self.sup.procs:
                poller.register(self.p.subscriber.socket, zmq.POLLIN)
            if self.p.events_sub is not None and self._events_polled():
                poller.register(self.p.events_sub.socket, zmq.POLLIN)
            fds = self.sup.fds()
            for fd in fds:
                poller.register(fd, zmq.POLLIN)
            ready = dict(poller.poll(timeout))
            if self._sig_r.fileno() in ready:
                self._drain_signals()
            if self._heartbeats in ready or (
                    (due := self._beats_due()) is not None and self.p.clock() >= due):
                self._drain_heartbeats()
            for fd, name in fds.items():
                if fd in ready:
                    self.sup.on_exit(name)
            self._check_runonce()
            self._drain_events()
            if control.socket in ready:
                control.serve(self.p.clock())
        self._drain_events()
        if self.events is not None:
            self.events.persist(force=True)
        self.p.log.info("agent.stopped", bad_heartbeats=self.bad_beats)
        if self._left_pods:
            print(self._left_pods, file=sys.stderr, flush=True)
        if self.p.config.run_once:
            return self._print_runonce(self._runonce or INTERRUPTED)
        return 0

    @staticmethod
    def _print_runonce(report: Report) -> int:
        for line in report.lines:
            print(line, flush=True)
        print(report.summary, file=sys.stderr, flush=True)
        return report.exit_code

    def close(self) -> None:
        self.faults.close()
        signal.set_wakeup_fd(-1)
        if self._beat_files is not None:
            self._beat_files.close()
        self._heartbeats.close(linger=0)
        self._sig_r.close()
        self._sig_w.close()
