"""The supervisor's decisions over its processes, without sockets or signals.

`Supervisor` owns the `SupervisedProcess` records. The event loop (`podvisor.supervisor.loop`)
feeds it what happened (`on_exit`, `on_beat`, control commands) and calls `tick()` when a
deadline passes; `tick()` returns the next deadline. Time comes from the injected clocks, so unit
tests drive it with a fake clock and `FakeSpawner`. Not thread-safe: the loop thread only.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from podvisor.common.logs import EventLog
from podvisor.ipc.control import LastExit, ProcessState
from podvisor.supervisor.heartbeat import Beat
from podvisor.supervisor.policy import Action, History, on_crash, on_normal_exit
from podvisor.supervisor.process import Intent, SupervisedProcess
from podvisor.supervisor.registry import ProcessSpec
from podvisor.supervisor.spawner import ExitStatus, Spawner
from podvisor.supervisor.states import StateChange, change_state

__all__ = ["CoreDeps", "Supervisor"]

S = ProcessState
RESTARTABLE = frozenset({S.STOPPED, S.EXITED, S.BACKOFF, S.FATAL})
LATE_WAKE = 2.0  # seconds past its deadline after which the loop counts as having been paused


@dataclass(frozen=True)
class CoreDeps:
    clock: Callable[[], float]  # monotonic
    wall: Callable[[], float]  # time.time, for published timestamps only
    spawner: Spawner
    notify: Callable[[StateChange], None]
    log: EventLog
    rand: Callable[[], float]
    env: Mapping[str, str]  # added to every child's environment
    # a RUNNING process without a heartbeat this long is late (said once through ``on_late``,
    # and once more when it beats again); None: never (only the heartbeat timeout acts). Read
    # at each spawn: an incarnation keeps the value of its start, as it keeps the heartbeat
    # interval it read then (a reload changes it for the processes that start after it)
    late_after: Callable[[], float | None] = lambda: None
    on_late: Callable[[SupervisedProcess, bool, float], None] = lambda proc, late, age: None


class Supervisor:
    def __init__(self, specs: Iterable[ProcessSpec], deps: CoreDeps) -> None:
        self.d = deps
        self.procs: dict[str, SupervisedProcess] = {}
        for spec in specs:
            self.procs[spec.name] = SupervisedProcess(spec, state_since=deps.clock())
        self.shutting_down = False
        self._shutdown_deadline = 0.0
        self._shutdown_queue: list[SupervisedProcess] = []
        self._expected_wake: float | None = None

    # --- transitions -----------------------------------------------------------------------

    def _to(self, proc: SupervisedProcess, state: ProcessState, reason: str) -> None:
        proc.reason = reason
        proc.late = False  # the new state says it all
        change_state(proc, state, self.d.notify, self.d.clock(), self.d.wall())

    def _spawn(self, proc: SupervisedProcess, reason: str) -> None:
        now = self.d.clock()
        spec = proc.spec
        env = {**self.d.env, "PODVISOR_MODULE": spec.module,
               "PODVISOR_STOP_TIMEOUT": str(spec.stop_timeout)}
        proc.started_at = proc.last_beat = now
        proc.late_after = self.d.late_after()
        proc.intent = Intent.NONE
        try:
            proc.handle = self.d.spawner.spawn(spec, env)
            proc.last_pid = proc.handle.pid
        except OSError as exc:
            proc.handle = proc.last_pid = None
            self._to(proc, S.STARTING, reason)
            info = LastExit(None, None, f"spawn failed: {exc}", self.d.wall(), 0.0)
            self.d.log.error("process.spawn_failed", process=proc.name, error=str(exc))
            self._after_crash(proc, info)
            return
        proc.due_at = now + spec.heartbeat_timeout  # ready deadline
        self._to(proc, S.STARTING, reason)
        self.d.log.info("process.spawned", process=proc.name, pid=proc.pid, reason=reason)

    def _signal(self, proc: SupervisedProcess, sig: int) -> None:
        if proc.handle is not None:
            proc.handle.send_signal(sig)

    def stop_process(self, proc: SupervisedProcess, intent: Intent, reason: str) -> None:
        """SIGTERM now (with SIGCONT, as a stopped process would not act on it), SIGKILL after
        the spec's stopTimeout (see `tick`)."""
        proc.intent = intent
        if proc.state == S.STOPPING:
            return
        now = self.d.clock()
        proc.due_at = now + proc.spec.stop_timeout
        self._to(proc, S.STOPPING, reason)
        self.d.log.info("process.stopping", process=proc.name, pid=proc.pid, reason=reason)
        if proc.spec.stop_timeout <= 0:
            self._signal(proc, signal.SIGKILL)
            return
        self._signal(proc, signal.SIGTERM)
        self._signal(proc, signal.SIGCONT)

    def _after_crash(self, proc: SupervisedProcess, info: LastExit) -> None:
        proc.last_exit = info
        now = self.d.clock()
        decision = on_crash(proc.spec, proc.history, now, info.ran_for)
        proc.history = decision.history
        if decision.action == Action.FATAL:
            proc.due_at = None
            self._to(proc, S.FATAL, f"{info.reason}; {decision.reason}")
            self.d.log.error("process.fatal", process=proc.name, reason=proc.reason)
            return
        proc.due_at = now + decision.delay
        self._to(proc, S.BACKOFF, info.reason)
        self.d.log.warning("process.crashed", process=proc.name, reason=info.reason,
                           delay=round(decision.delay, 3), streak=decision.history.streak)

    # --- events from the loop --------------------------------------------------------------

    def on_exit(self, name: str) -> None:
        """The process's pidfd became readable: reap it and decide what comes next."""
        proc = self.procs.get(name)
        if proc is None or proc.handle is None:
            return
        status = proc.handle.poll()
        if status is None:
            return
        proc.handle.close()
        pid, proc.handle = proc.handle.pid, None
        self._exited(proc, pid, status)

    def _exited(self, proc: SupervisedProcess, pid: int, status: ExitStatus) -> None:
        now = self.d.clock()
        ran_for = now - proc.started_at
        reason = status.describe()
        if proc.intent == Intent.HUNG:
            reason = f"{proc.reason} ({reason})"
        info = LastExit(status.code, status.signal, reason, self.d.wall(), ran_for)
        self.d.log.info("process.exited", process=proc.name, pid=pid, reason=reason,
                        ran_for=round(ran_for, 3))
        intent, proc.intent = proc.intent, Intent.NONE
        if proc.state == S.STOPPING and intent != Intent.HUNG:
            proc.last_exit = info
            proc.due_at = None
            self._to(proc, S.STOPPED, f"stopped ({reason})")
            if intent == Intent.RESTART and not self.shutting_down:
                proc.history = History()
                self._spawn(proc, "restart requested")
            elif intent == Intent.REMOVE:
                del self.procs[proc.name]
            return
        if status.clean and intent != Intent.HUNG:
            proc.last_exit = info
            decision = on_normal_exit(proc.spec, proc.history, self.d.rand())
            proc.history = decision.history
            proc.due_at = now + decision.delay
            self._to(proc, S.EXITED, reason)
            return
        self._after_crash(proc, info)

    def on_beat(self, beat: Beat) -> None:
        """A ready/heartbeat message; ignored unless it comes from the current incarnation."""
        proc = self.procs.get(beat.name)
        if proc is None or proc.handle is None or proc.handle.pid != beat.pid:
            return
        proc.last_beat = self.d.clock()
        if proc.late:
            proc.late = False
            self.d.on_late(proc, False, 0.0)
        if proc.state == S.STARTING:
            proc.due_at = None
            self._to(proc, S.RUNNING, "ready")

    def tick(self) -> float | None:
        """Act on every deadline that passed; return the next deadline (monotonic) or None.

        If the loop itself woke up far too late (the agent was stopped or starved), heartbeat
        ages are reset first: the silence was ours, not the children's."""
        now = self.d.clock()
        if self._expected_wake is not None and now > self._expected_wake + LATE_WAKE:
            self.d.log.warning("agent.late_wake", late=round(now - self._expected_wake, 3))
            for proc in self.procs.values():
                if proc.state == S.RUNNING:
                    proc.last_beat = now
        for proc in list(self.procs.values()):
            self._tick_one(proc, now)
        if self.shutting_down:
            self._tick_shutdown(now)
        self._expected_wake = self.next_deadline()
        return self._expected_wake

    def _tick_one(self, proc: SupervisedProcess, now: float) -> None:
        spec = proc.spec
        due = proc.due_at is not None and now >= proc.due_at
        if proc.state in (S.EXITED, S.BACKOFF) and due and not self.shutting_down:
            proc.restarts += 1
            self._spawn(proc, "period elapsed" if proc.state == S.EXITED else "backoff elapsed")
        elif proc.state == S.STARTING and due:
            self.stop_process(proc, Intent.HUNG, f"not ready within {spec.heartbeat_timeout:g}s")
        elif proc.state == S.RUNNING and now - proc.last_beat > spec.heartbeat_timeout:
            self.stop_process(proc, Intent.HUNG, f"no heartbeat for {spec.heartbeat_timeout:g}s")
        elif proc.state == S.RUNNING and not proc.late \
                and now - proc.last_beat > (self._late_after(proc) or math.inf):
            proc.late = True
            self.d.log.warning("process.heartbeat_late", process=proc.name, pid=proc.pid,
                               age=round(now - proc.last_beat, 3))
            self.d.on_late(proc, True, now - proc.last_beat)
        elif proc.state == S.STOPPING and due:
            proc.due_at = None
            self.d.log.warning("process.kill", process=proc.name, pid=proc.pid,
                               reason=f"still running {spec.stop_timeout:g}s after SIGTERM")
            self._signal(proc, signal.SIGKILL)

    def _late_after(self, proc: SupervisedProcess) -> float | None:
        """When this process counts as late: its ``late_after``, if before its heartbeat
        timeout."""
        after = proc.late_after
        return after if after is not None and after < proc.spec.heartbeat_timeout else None

    def next_deadline(self) -> float | None:
        deadlines: list[float] = []
        for proc in self.procs.values():
            if proc.due_at is not None and proc.state in (S.EXITED, S.BACKOFF, S.STARTING,
                                                          S.STOPPING):
                deadlines.append(proc.due_at)
            if proc.state == S.RUNNING:
                deadlines.append(proc.last_beat + proc.spec.heartbeat_timeout + 0.001)
                late_after = self._late_after(proc)
                if late_after is not None and not proc.late:
                    deadlines.append(proc.last_beat + late_after + 0.001)
        if self.shutting_down:
            deadlines.append(self._shutdown_deadline)
        return min(deadlines) if deadlines else None

    # --- operator actions (raise LookupError / ValueError; the control boundary maps them) --

    def get(self, name: str) -> SupervisedProcess:
        proc = self.procs.get(name)
        if proc is None:
            raise KeyError(name)
        return proc

    def start(self, name: str) -> SupervisedProcess:
        """Start a STOPPED/EXITED/BACKOFF/FATAL process now, with a fresh crash history."""
        proc = self.get(name)
        if proc.state not in RESTARTABLE:
            raise ValueError(f"{name} is {proc.state.name}")
        proc.history = History()
        self._spawn(proc, "start requested")
        return proc

    def stop(self, name: str) -> SupervisedProcess:
        proc = self.get(name)
        if proc.alive:
            self.stop_process(proc, Intent.STOP, "stop requested")
        elif proc.state in (S.EXITED, S.BACKOFF, S.FATAL):
            proc.due_at = None
            self._to(proc, S.STOPPED, "stop requested")
        return proc

    def restart(self, name: str) -> SupervisedProcess:
        proc = self.get(name)
        if proc.alive:
            self.stop_process(proc, Intent.RESTART, "restart requested")
            return proc
        return self.start(name)

    def kill(self, name: str, sig: int) -> SupervisedProcess:
        """Deliver exactly `sig` (fault injection); what follows is the normal handling."""
        proc = self.get(name)
        if proc.handle is None or not proc.handle.send_signal(sig):
            raise ProcessLookupError(f"{name} is not running")
        self.d.log.info("process.signalled", process=proc.name, pid=proc.pid, signal=sig)
        return proc

    def start_all(self) -> None:
        for proc in list(self.procs.values()):
            if proc.spec.enabled and proc.state == S.STOPPED:
                self._spawn(proc, "agent start")

    # --- shutdown: reverse start order, each within its stopTimeout, all within `timeout` ---

    def begin_shutdown(self, timeout: float) -> None:
        if self.shutting_down:
            return
        self.shutting_down = True
        self._shutdown_deadline = self.d.clock() + timeout
        self._shutdown_queue = list(reversed(self.procs.values()))
        for proc in self.procs.values():
            if proc.state in (S.EXITED, S.BACKOFF):
                proc.due_at = None
                self._to(proc, S.STOPPED, "agent shutdown")

    def _tick_shutdown(self, now: float) -> None:
        if now >= self._shutdown_deadline:
            for proc in self.procs.values():
                if proc.alive and proc.handle is not None:
                    self.d.log.warning("process.kill", process=proc.name, pid=proc.pid,
                                       reason="shutdown timeout")
                    proc.intent = Intent.SHUTDOWN
                    self._signal(proc, signal.SIGKILL)
            self._shutdown_deadline = now + 3600.0
            return
        while self._shutdown_queue:
            proc = self._shutdown_queue[0]
            if not proc.alive:
                self._shutdown_queue.pop(0)
                continue
            if proc.state != S.STOPPING:
                self.stop_process(proc, Intent.SHUTDOWN, "agent shutdown")
            return

    @property
    def shutdown_done(self) -> bool:
        return self.shutting_down and not any(p.alive for p in self.procs.values())

    def kill_all(self) -> None:
        """SIGKILL and reap every live child (the last resort when the loop itself failed)."""
        for proc in self.procs.values():
            if proc.handle is not None:
                proc.handle.send_signal(signal.SIGKILL)
                for _ in range(200):
                    if proc.handle.poll() is not None:
                        break
                    time.sleep(0.01)
                proc.handle.close()
                proc.handle = None

    def fds(self) -> dict[int, str]:
        """pidfd -> process name, for every process with a live OS process."""
        return {p.handle.fileno(): p.name for p in self.procs.values() if p.handle is not None}
