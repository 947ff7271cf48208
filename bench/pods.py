"""Pods benchmark: podvisor (real agent, embedded runtime) beside supervisord, same run (not a
test; prints figures and ratios).

1. Manifest dropped in `staticPodPath` -> the pod's container running in `/pods`: p50/p99 over
   N pods one at a time (a new manifest each; deleted and gone before the next), and the time
   until M manifests dropped at once (renamed in from a staging dir) are all running. The agent
   is not polled while pods start (polling a 200-pod /pods every few ms costs the agent more
   CPU than it saves): the status process's bus updates say when they are running, then /pods
   is polled until it agrees. Peers:
   supervisord with M programs (`startsecs=0`), from `update` (reloadConfig + addProcessGroup,
   what `supervisorctl update` does, with supervisord already running: the closest analogue of
   a running agent seeing new manifests) and from a cold `supervisord` start, until
   `getAllProcessInfo` shows all RUNNING; and two floors: M direct `subprocess.Popen`, and M
   pods driven straight through the CRI (RunPodSandbox, CreateContainer, StartContainer) by 16
   client threads against a fresh embedded runtime with two event streams read, no agent
   (bench/runtime.py `cri_burst`): the CRI traffic's own share, which the agent adds to.
2. kill -9 of a container's process -> the replacement running (restartPolicy Always, first
   restart: one fresh pod per kill), beside supervisord's autorestart of a program. "Running" is
   the replacement's execve as the kernel reports it (process connector, bench/proc_events.py:
   one neutral witness for both, CLOCK_MONOTONIC timestamps). supervisord is timed twice: with
   nobody polling it (it restarts a program at its next main-loop turn: up to 1 s) and polled
   over XML-RPC every `--poll-ms` (each request wakes its loop: its best case, the figure the
   target is judged against). podvisor is timed with nobody watching it but the kernel (the
   headline), then again with the runtime's event stream and the bus subscribed, for the
   milestones: the runtime's STOPPED/STARTED events and PLEG's ContainerDied (each extra
   subscriber costs the runtime work on the restart's path, so that pass is slower). Without
   root, podvisor falls back to the runtime's CONTAINER_STARTED event and supervisord to polling
   only.
3. Idle CPU and PSS with K pods (`sleep`) beside supervisord with K programs, both measured over
   the same `--windows` windows from outside (bench/outside.py: utime+stime+cutime+cstime of
   every process of the agent's tree, the containers and their monitors pruned; then again with
   the monitors; supervisord's daemon alone, its programs being the workload). Each figure is
   the windows' median with their range.
4. Scale (`--scale 110,250,1000`): for each count, a fresh agent; all its manifests dropped at
   once -> all running in /pods; then, with them all running: idle CPU and resident memory of
   the agent's processes, GET /pods (time and size), one PLEG relist (the PLEG's own relister
   over the agent's CRI socket: ListPodSandbox + ListContainers + the diff), and the sync loop's
   lag: one more manifest -> running on the status bus, with the others all running.

The manifests run `sleep` from the embedded runtime's image `host` with
`imagePullPolicy: IfNotPresent`, as production manifests with pinned images do (`host` has no
tag, so Kubernetes would default it to Always: one PullImage call per container start; compare
with `--pull-policy Always`).

    .venv/bin/python bench/pods.py [--quick] [-n 20] [--many 200] [--idle-pods 110]
        [--idle-seconds 60] [--stages 1,2,3] [--pull-policy IfNotPresent|Always]
        [--scale 110,250,1000] [--limits]

`--limits` gives every container CPU and memory limits (a cgroup per container, created by the
runtime, joined by the monitor before the exec) on top of the security context every container
gets (the monitor's private mount namespace for the masked paths): what they cost at scale.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import zmq
from cri_api.v1 import api_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parent))

import outside
from pods_agent import Agent, alive_descendants, kill_descendants, pod_name, poll
from pods_idle import cpu_seconds, measure_idle, resident_mb
from proc_events import ExecWatcher
from runtime import cri_burst
from supervisord_peer import Supervisord, free_port, spawn_floor, supervisord_many

from podvisor.ipc.bus import Subscriber
from podvisor.ipc.messages import MapUpdate, PodLifecycleEvent
from podvisor.services.cri import new_runtime_client
from podvisor.services.pleg.relist import new_relister
from podvisor.services.syncloop import labels as L

PR_SET_CHILD_SUBREAPER = 36


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(values: list[float]) -> str:
    return (f"p50 {statistics.median(values) * 1000:7.1f} ms   "
            f"p99 {pct(values, 0.99) * 1000:7.1f} ms   max {max(values) * 1000:7.1f} ms"
            f"   (n={len(values)})")


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b > 0 else "n/a"


# --- 1. manifest to running -------------------------------------------------------------------

def wait_empty(agent: Agent, timeout: float = 180.0) -> None:
    poll(lambda: agent.pod_count() == 0 and not agent.all_containers(), timeout, 0.05,
         "every pod gone from /pods and the runtime")


class BusWatch:
    """Reads the `pleg` and `statuses` map updates off the bus: per pod UID, the bus time of
    the first PLEG record and the first status that show its containers running."""

    def __init__(self, sub: Subscriber) -> None:
        self.sub = sub
        self.pleg: dict[str, float] = {}
        self.status: dict[str, float] = {}
        self.missed = False  # the bus missed updates: /pods said all were running

    def reset(self) -> None:
        while self.sub.recv(timeout=0.0) is not None:
            pass
        self.pleg.clear()
        self.status.clear()

    def pump(self, timeout: float) -> None:
        """Consume what arrives within `timeout` (then whatever is queued)."""
        env = self.sub.recv(timeout=timeout)
        while env is not None:
            msg = env.message
            if isinstance(msg, MapUpdate) and isinstance(msg.value, dict):
                if msg.map == "pleg" and any(c.get("state") == "CONTAINER_RUNNING"
                                             for c in msg.value.get("containers", [])):
                    self.pleg.setdefault(msg.key, env.ts)
                statuses = (msg.value.get("status") or {}).get("containerStatuses", [])
                if msg.map == "statuses" and statuses and all(
                        "running" in c.get("state", {}) for c in statuses):
                    self.status.setdefault(msg.key, env.ts)
            env = self.sub.recv(timeout=0.0)

    def wait_running(self, count: int, timeout: float,
                     fallback: Callable[[], int] | None = None) -> None:
        """Until ``count`` pods are running on the bus. ``fallback`` (pods running in /pods) is
        asked every 2 s: a subscriber past its high-water mark misses updates (1,000 pods at
        once), and then only /pods can tell; ``self.missed`` says so."""
        deadline = time.monotonic() + timeout
        ask_at = time.monotonic() + 2.0
        while len(self.status) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.status)} of {count} pods running on the bus")
            self.pump(0.5)
            if fallback is not None and time.monotonic() >= ask_at:
                ask_at = time.monotonic() + 2.0
                if len(self.status) < count and fallback() >= count:
                    self.missed = True
                    return


@dataclass
class Single:
    """Seconds from the manifest's rename into staticPodPath to each milestone (lists over the
    pods): container RUNNING over CRI, PLEG record running (bus), status running (bus), and
    running in /pods."""

    cri: list[float] = field(default_factory=list)
    pleg: list[float] = field(default_factory=list)
    status: list[float] = field(default_factory=list)
    pods: list[float] = field(default_factory=list)


def one_pod(agent: Agent, bus: BusWatch, n: int) -> Single:
    """One pod at a time; the first pod is a warm-up. Nothing is polled until the status
    process has published the pod running; then /pods is polled every 2 ms."""
    out = Single()
    for i in range(n + 1):
        name = f"one{i}"
        staged = agent.stage(name)
        bus.reset()
        t0 = time.monotonic()
        agent.drop(staged)
        bus.wait_running(1, 60.0)
        poll(lambda name=name: pod_name(name) in agent.running_names(), 60.0, 0.002,
             f"{name} running in /pods")
        t1 = time.monotonic()
        [container] = agent.containers(name)
        uid = container.labels[L.POD_UID]
        if i:
            out.pods.append(t1 - t0)
            out.cri.append(int(agent.started(container.id)["started_at"]) / 1e9
                           + time.monotonic() - time.time() - t0)
            out.pleg.append(bus.pleg.get(uid, t1) - t0)
            out.status.append(bus.status.get(uid, t1) - t0)
        (agent.manifests / staged.name).unlink()
        wait_empty(agent)
    return out


def many_pods(agent: Agent, bus: BusWatch, count: int
              ) -> tuple[float, float, float, dict[str, float]]:
    """(every container started by the runtime, the status process published all running,
    all running in /pods) seconds after `count` manifests were dropped at once, and each agent
    process's CPU seconds meanwhile. The agent is not polled while the pods start: the status
    process's bus updates say when all are running; only then /pods is polled (every 5 ms)
    until it shows them all running."""
    staged = [agent.stage(f"many{i}") for i in range(count)]
    bus.reset()
    procs = agent.agent_processes()
    names = {p.pid: p.name() for p in procs}
    cpu_before = cpu_seconds(procs)
    t0 = time.monotonic()
    for path in staged:
        agent.drop(path)
    bus.wait_running(count, 300.0)
    on_bus = time.monotonic()
    poll(lambda: len(agent.running_names()) >= count, 60.0, 0.005, f"{count} running in /pods")
    t1 = time.monotonic()
    cpu: dict[str, float] = {}
    for (pid, born), seconds in cpu_seconds(procs).items():  # (those there before the burst)
        if (pid, born) in cpu_before:
            cpu[names[pid]] = cpu.get(names[pid], 0.0) + seconds - cpu_before[(pid, born)]
    wall_to_mono = time.monotonic() - time.time()
    started = max(int(agent.started(c.id)["started_at"]) for c in agent.all_containers())
    agent.remove_all()
    wait_empty(agent)
    return (started / 1e9 + wall_to_mono - t0, on_bus - t0, t1 - t0, cpu)


# `--json`: the figures of stages 1 to 3, printed as one JSON object on the last line
JSON_FIGURES: dict[str, object] = {}


def stage_start(agent: Agent, args: argparse.Namespace) -> None:
    print(f"\n1. manifest -> container running in /pods ({args.n} pods one at a time, "
          f"then {args.many} at once)")
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = Subscriber(zctx, agent.paths, ["clone.pleg.update", "clone.statuses.update"])
    try:
        bus = BusWatch(sub)
        single = one_pod(agent, bus, args.n)
        started, on_bus, many, cpu = many_pods(agent, bus, args.many)
    finally:
        sub.close()
        zctx.destroy(linger=0)
    print(f"  podvisor, 1 pod               {ms(single.pods)}")
    print(f"    -> container started        {ms(single.cri)}")
    print(f"    -> PLEG record running      {ms(single.pleg)}")
    print(f"    -> status running           {ms(single.status)}")
    update, cold = supervisord_many(args.many)
    floor = spawn_floor(args.many, ["sleep", "3600"])
    cri = cri_burst(args.many)
    print(f"  podvisor, {args.many} pods at once     {many * 1000:8.0f} ms   "
          f"(last container started after {started * 1000:.0f} ms, all running on the "
          f"status bus after {on_bus * 1000:.0f} ms)")
    per_pod = sorted(((seconds * 1000 / args.many, name) for name, seconds in cpu.items()),
                     reverse=True)
    print(f"    agent CPU meanwhile: {sum(cpu.values()) * 1000 / args.many:.2f} ms per pod ("
          + ", ".join(f"{name} {ms_:.2f}" for ms_, name in per_pod if ms_ >= 0.05) + ")")
    print(f"  supervisord, update -> all RUNNING   {update * 1000:8.0f} ms")
    print(f"  supervisord, cold start -> all RUNNING {cold * 1000:6.0f} ms")
    print(f"  floor, {args.many} x subprocess.Popen     {floor * 1000:8.0f} ms")
    print(f"  floor, {args.many} pods through the CRI alone {cri * 1000:6.0f} ms   (embedded "
          f"runtime, no agent: 3 calls per pod from 16 threads, 2 event streams read; "
          f"{ratio(cri, update)} x supervisord update)")
    print(f"  ratio podvisor / supervisord (update)     {ratio(many, update)}   target <= 0.7")
    print(f"  ratio podvisor / supervisord (cold start) {ratio(many, cold)}")
    print(f"  ratio podvisor / the CRI-alone floor      {ratio(many, cri)}   target <= 1.2")
    JSON_FIGURES.update(one_pod_s=list(single.pods), many=args.many, many_s=many,
                        supervisord_update_s=update, supervisord_cold_s=cold,
                        popen_floor_s=floor, cri_floor_s=cri)


# --- 2. kill -9 to replacement running ----------------------------------------------------------

@dataclass(frozen=True)
class Restart:
    """Seconds from the kill -9 to: the runtime's CONTAINER_STOPPED event (GetContainerEvents,
    arrival here), PLEG publishing ContainerDied (bus envelope time), the replacement created
    (its CRI created_at), the replacement's exec (kernel process connector; NaN without it) and
    the runtime's CONTAINER_STARTED event of the replacement (arrival here)."""

    stopped: float
    died_event: float
    created: float
    exec: float
    started: float

    @property
    def running(self) -> float:
        """The headline: the exec when the kernel told us, else the runtime's STARTED event."""
        return self.started if math.isnan(self.exec) else self.exec


class RuntimeEvents:
    """The runtime's GetContainerEvents stream read on a thread: (arrival, event) pairs. One more
    subscriber costs the runtime one message per event, and nothing is polled."""

    def __init__(self, agent: Agent) -> None:
        assert agent.cri is not None
        self.stream = agent.cri.container_events()
        self.stream.wait_subscribed()  # no kill before it: its STOPPED event would be missed
        self.items: queue.SimpleQueue[tuple[float, pb.ContainerEventResponse]] = \
            queue.SimpleQueue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with contextlib.suppress(Exception):  # the stream ends when closed
            for event in self.stream:
                self.items.put((time.monotonic(), event))

    def drain(self) -> None:
        while not self.items.empty():
            self.items.get_nowait()

    def wait(self, match: Callable[[pb.ContainerEventResponse], bool], timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while True:
            try:
                at, event = self.items.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError("no matching runtime event") from None
            if match(event):
                return at

    def close(self) -> None:
        self.stream.close()
        self.thread.join(5)


def _is_replacement(name: str, old_id: str, count: int) -> Callable[[pb.ContainerEventResponse],
                                                                     bool]:
    def match(event: pb.ContainerEventResponse) -> bool:
        if event.container_event_type != pb.CONTAINER_STARTED_EVENT or \
                event.container_id == old_id or not event.containers_statuses:
            return False
        mine = event.containers_statuses[0]
        return (mine.labels.get(L.POD_NAME) == pod_name(name)
                and int(mine.annotations.get(L.RESTART_COUNT, "0")) == count + 1)
    return match


def replacement(agent: Agent, sub: Subscriber, events: RuntimeEvents,
                execs: ExecWatcher | None, name: str) -> Restart:
    """kill -9 the pod's container process; wait (no polling) for the runtime's STOPPED event,
    the replacement's exec and its STARTED event; then check it over CRI."""
    [old] = [c for c in agent.containers(name) if c.state == pb.CONTAINER_RUNNING]
    count = int(old.annotations[L.RESTART_COUNT])
    pid = int(agent.started(old.id)["pid"])
    argv = tuple(psutil.Process(pid).cmdline())
    while sub.recv(timeout=0.0) is not None:
        pass
    events.drain()
    t0 = time.monotonic()
    os.kill(pid, 9)
    stopped = events.wait(lambda e: e.container_id == old.id
                          and e.container_event_type == pb.CONTAINER_STOPPED_EVENT, 30.0)
    started = events.wait(_is_replacement(name, old.id, count), 30.0)
    exec_at = math.nan
    if execs is not None:
        exec_at = execs.wait(lambda e: e.argv == argv and e.pid != pid, t0, 30.0).ts
    new = _replaced(agent, name, old.id, count)
    created = new.created_at / 1e9 + (time.monotonic() - time.time())
    # PLEG may publish ContainerDied after the replacement started (it applies back-to-back
    # kills in 25 ms batches; the restart does not wait for it): wait for it, up to 2 s.
    died = math.inf
    deadline = time.monotonic() + 2.0
    while math.isinf(died) and (left := deadline - time.monotonic()) > 0:
        env = sub.recv(timeout=left)
        if env is None:
            break
        msg = env.message
        if isinstance(msg, PodLifecycleEvent) and msg.type == "ContainerDied" \
                and msg.container_id == old.id:
            died = env.ts
    return Restart(stopped - t0, died - t0, created - t0, exec_at - t0, started - t0)


def _replaced(agent: Agent, name: str, old_id: str, count: int) -> pb.Container:
    """The pod's running replacement, checked over CRI (after the timing: polling is fine)."""
    def found() -> pb.Container | None:
        running = [c for c in agent.containers(name) if c.state == pb.CONTAINER_RUNNING]
        return running[0] if len(running) == 1 and running[0].id != old_id else None
    new = poll(found, 30.0, 0.005, f"{name}'s replacement running over CRI")
    assert new is not None and int(new.annotations[L.RESTART_COUNT]) == count + 1
    return new


def quiet_replacement(agent: Agent, execs: ExecWatcher, name: str) -> float:
    """kill -9 the pod's container process; seconds to the replacement's exec as the kernel
    reports it, with nobody else watching the agent (no event stream, no bus subscriber: each
    would cost the runtime work on the restart's path). Then checked over CRI."""
    [old] = [c for c in agent.containers(name) if c.state == pb.CONTAINER_RUNNING]
    count = int(old.annotations[L.RESTART_COUNT])
    pid = int(agent.started(old.id)["pid"])
    argv = tuple(psutil.Process(pid).cmdline())
    t0 = time.monotonic()
    os.kill(pid, 9)
    exec_at = execs.wait(lambda e: e.argv == argv and e.pid != pid, t0, 30.0).ts
    _replaced(agent, name, old.id, count)
    return exec_at - t0


def _sd_kill(sd: Supervisord, i: int, execs: ExecWatcher, poll_s: float | None) -> float:
    """kill -9 program r<i>; seconds to its new process's exec. `poll_s`: meanwhile call
    getProcessInfo every `poll_s` (each request wakes supervisord's select loop; unpolled, it
    notices the death and restarts the program only at its next loop turn, up to 1 s later)."""
    old = sd.rpc.supervisor.getProcessInfo(f"r{i}")["pid"]
    argv = ("sleep", str(5000 + i))
    t0 = time.monotonic()
    os.kill(old, 9)
    if poll_s is not None:
        seen: list[int] = []

        def restarted() -> bool:
            info = sd.rpc.supervisor.getProcessInfo(f"r{i}")
            if info["statename"] == "RUNNING" and info["pid"] not in (0, old):
                seen.append(info["pid"])
            return bool(seen)
        poll(restarted, 30.0, poll_s, f"supervisord to restart r{i}")
    hit = execs.wait(lambda e: e.argv == argv and e.pid != old, t0, 30.0)
    poll(lambda: sd.rpc.supervisor.getProcessInfo(f"r{i}")["pid"] == hit.pid, 10.0, 0.005,
         "supervisord to report the new pid")
    return hit.ts - t0


def supervisord_kills(n: int, execs: ExecWatcher | None,
                      poll_ms: float) -> tuple[list[float], list[float]]:
    """supervisord's autorestart of `n` + 1 programs (the first a warm-up), each with its own
    command line: seconds from kill -9 to the new process's exec, (unpolled, polled every
    `poll_ms` over XML-RPC). Without the process connector: ([], getProcessInfo polled)."""
    sd = Supervisord()
    try:
        for i in range(n + 1):
            sd.write_programs([f"r{i}"], command=f"sleep {5000 + i}")
        sd.start()
        sd.wait_rpc()
        sd.wait_all_running(n + 1)
        if execs is None:
            return [], [sd.kill9_restart(f"r{i}", interval=poll_ms / 1000)
                        for i in range(n + 1)][1:]
        quiet = [_sd_kill(sd, i, execs, None) for i in range(n + 1)][1:]
        polled = [_sd_kill(sd, i, execs, poll_ms / 1000) for i in range(n + 1)][1:]
        return quiet, polled
    finally:
        sd.stop()


def stage_kill(agent: Agent, args: argparse.Namespace) -> None:
    execs = ExecWatcher.open()
    how = ("exec seen by the kernel's process connector" if execs is not None else
           "runtime STARTED event / XML-RPC poll (no process connector: not root?)")
    print(f"\n2. kill -9 -> replacement running (first restart, {args.n} kills; "
          f"running = {how})")
    # one pod per kill and pass, plus a warm-up pod per pass
    quiet_names = [f"kq{i}" for i in range(args.n + 1)] if execs is not None else []
    names = [f"kill{i}" for i in range(args.n + 1)]
    for path in [agent.stage(n) for n in quiet_names + names]:
        agent.drop(path)
    poll(lambda: len(agent.running_names()) >= len(quiet_names + names), 120.0, 0.05,
         "kill pods running")
    quiet_ours: list[float] = []
    if execs is not None:
        quiet_ours = [quiet_replacement(agent, execs, n) for n in quiet_names][1:]
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = Subscriber(zctx, agent.paths, [PodLifecycleEvent.TOPIC])
    events = RuntimeEvents(agent)
    try:
        results = [replacement(agent, sub, events, execs, n) for n in names][1:]
    finally:
        events.close()
        sub.close()
        zctx.destroy(linger=0)
    watched = [r.running for r in results]
    ours = quiet_ours or watched
    agent.remove_all()
    wait_empty(agent)
    try:
        quiet, polled = supervisord_kills(args.n, execs, args.poll_ms)
    finally:
        if execs is not None:
            execs.close()
    print(f"  podvisor                      {ms(ours)}")
    if quiet_ours:
        print(f"  podvisor, watched (milestones below: one more event-stream subscriber "
              f"and a bus subscriber) {ms(watched)}")
    print(f"    kill -> runtime STOPPED event {ms([r.stopped for r in results])}")
    print(f"    kill -> PLEG ContainerDied  {ms([r.died_event for r in results])}")
    print(f"    kill -> replacement created {ms([r.created for r in results])}")
    print(f"    kill -> runtime STARTED event {ms([r.started for r in results])}")
    if quiet:
        print(f"  supervisord, nobody polling   {ms(quiet)}")
    print(f"  supervisord, XML-RPC poll every {args.poll_ms:g} ms {ms(polled)}")
    JSON_FIGURES.update(kill_s=list(ours), supervisord_kill_polled_s=list(polled))
    print(f"  ratio podvisor / supervisord polled (its best case, p50) "
          f"{ratio(statistics.median(ours), statistics.median(polled))}   target <= 1")
    if quiet:
        print(f"  ratio podvisor / supervisord unpolled (p50)             "
              f"{ratio(statistics.median(ours), statistics.median(quiet))}")


# --- 3. idle -------------------------------------------------------------------------------------

def stage_idle(args: argparse.Namespace) -> None:
    print(f"\n3. idle: {args.idle_pods} pods / programs, {args.windows} windows of "
          f"{args.idle_seconds:.0f} s after {args.settle:.0f} s settling, measured from outside "
          f"(bench/outside.py: utime+stime+cutime+cstime of every process of each tree, PSS)")
    agent = Agent(free_port())
    agent.pull_policy = args.pull_policy
    sd = Supervisord()
    try:
        names = [f"idle{i}" for i in range(args.idle_pods)]
        for path in [agent.stage(n) for n in names]:
            agent.drop(path)
        sd.write_programs([f"i{i}" for i in range(args.idle_pods)])
        sd.start()
        agent.wait_ready()
        t_agent = time.monotonic()
        poll(lambda: len(agent.running_names()) >= args.idle_pods, 300.0, 0.1, "idle pods")
        print(f"  (agent start -> {args.idle_pods} pods running: "
              f"{time.monotonic() - t_agent:.1f} s after the control socket answered)")
        sd.wait_all_running(args.idle_pods)
        if agent.http is not None:
            agent.http.close()
            agent.http = None
        time.sleep(args.settle)
        assert agent.proc is not None and sd.proc is not None
        root, sd_pid = agent.proc.pid, sd.proc.pid
        groups = [
            outside.Group("podvisor agent", outside.tree_selector(
                lambda: [root], agent.runtime_pids)),
            outside.Group("podvisor agent + container monitors", outside.tree_selector(
                lambda: [root], agent.container_pids)),
            # its programs are the workload; the daemon's cutime holds any it reaped
            outside.Group("supervisord (daemon)",
                          lambda stats: {sd_pid} if sd_pid in stats else set()),
        ]
        print(f"  ({outside.load()} at the start of the windows)")
        figures = outside.measure(groups, args.windows, args.idle_seconds)
        print("\n".join(outside.report(figures, peer="supervisord (daemon)")))
        print(f"  ({outside.load()} at the end)")
        ours, total, theirs = (figures[g.label] for g in groups)
        together = resident_mb(agent.agent_processes())
        JSON_FIGURES.update(idle_pods=args.idle_pods, idle_cpu_pct=ours.cpu_pct,
                            idle_pss_mb=ours.pss_mb, idle_resident_mb=together,
                            idle_total_cpu_pct=total.cpu_pct, idle_total_pss_mb=total.pss_mb,
                            supervisord_idle_cpu_pct=theirs.cpu_pct,
                            supervisord_idle_pss_mb=theirs.pss_mb,
                            idle_by_process=ours.as_json()["by_process"])
        print(f"  agent resident together (distinct pages, pagemap): {together:.0f} MB; "
              f"ratios to supervisord: CPU "
              f"{ratio(statistics.median(ours.cpu_pct), statistics.median(theirs.cpu_pct))}, "
              f"PSS {ratio(statistics.median(ours.pss_mb), statistics.median(theirs.pss_mb))}")
    finally:
        sd.stop()
        report_leftovers("idle agent", agent.stop())


# --- 4. scale -----------------------------------------------------------------------------------

def _median_ms(fn: Callable[[], object], repeats: int) -> tuple[float, float, float]:
    """(median, min, max) milliseconds of ``fn`` over ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        t0 = time.monotonic()
        fn()
        times.append((time.monotonic() - t0) * 1000)
    return statistics.median(times), min(times), max(times)


def scale_one(count: int, args: argparse.Namespace) -> dict[str, float]:
    """The figures at ``count`` pods (see the module docstring, stage 4)."""
    agent = Agent(free_port())
    agent.pull_policy = args.pull_policy
    agent.limits = args.limits
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    out: dict[str, float] = {}
    try:
        agent.wait_ready()
        sub = Subscriber(zctx, agent.paths, ["clone.pleg.update", "clone.statuses.update"])
        bus = BusWatch(sub)
        staged = [agent.stage(f"s{i}") for i in range(count)]
        bus.reset()
        t0 = time.monotonic()
        for path in staged:
            agent.drop(path)
        bus.wait_running(count, 900.0, lambda: len(agent.running_names()))
        poll(lambda: len(agent.running_names()) >= count, 120.0, 0.05, f"{count} in /pods")
        out["at_once_s"] = time.monotonic() - t0
        out["bus_missed"] = float(bus.missed)
        if agent.http is not None:
            agent.http.close()
            agent.http = None
        time.sleep(args.settle)
        [usage] = measure_idle([("agent", agent.agent_processes)], args.idle_seconds)
        out["idle_cpu_pct"], out["idle_resident_mb"] = usage.cpu_percent, usage.resident_mb
        out["idle_rss_sum_mb"], out["agent_procs"] = usage.rss_mb, usage.processes
        body = len(json.dumps(agent.pods()))
        out["pods_ms"], out["pods_ms_min"], out["pods_ms_max"] = _median_ms(agent.pods, 5)
        out["pods_kb"] = body / 1024
        client = new_runtime_client(f"unix://{agent.paths.cri_socket}", timeout=30.0)
        try:
            relister = new_relister(client)
            relister.relist()  # the first one sees everything new
            out["relist_ms"], out["relist_ms_min"], out["relist_ms_max"] = _median_ms(
                relister.relist, 5)
        finally:
            client.close()
        lags = []
        for i in range(3):
            path = agent.stage(f"lag{i}")
            bus.reset()
            t1 = time.monotonic()
            agent.drop(path)
            bus.wait_running(1, 120.0)
            lags.append(time.monotonic() - t1)
        out["lag_ms"] = statistics.median(lags) * 1000
        out["lag_ms_min"], out["lag_ms_max"] = min(lags) * 1000, max(lags) * 1000
        sub.close()
    finally:
        zctx.destroy(linger=0)
        report_leftovers(f"agent with {count} pods", agent.stop())
    return out


def stage_scale(args: argparse.Namespace) -> None:
    counts = [int(c) for c in args.scale.split(",") if c]
    print(f"\n4. scale: {counts} pods{' with limits (a cgroup each)' if args.limits else ''}; "
          f"idle window {args.idle_seconds:.0f} s after {args.settle:.0f} s settling")
    for count in counts:
        f = scale_one(count, args)
        print(f"  {count:5d} pods: all at once -> running {f['at_once_s']:7.1f} s   idle CPU "
              f"{f['idle_cpu_pct']:5.2f} % of a core   resident (all agent processes) "
              f"{f['idle_resident_mb']:6.1f} MB ({f['agent_procs']:.0f} procs)"
              + ("   (the bench's bus subscriber missed updates: all running said by /pods, "
                 "asked every 2 s)" if f["bus_missed"] else ""))
        print(f"        GET /pods {f['pods_ms']:7.1f} ms ({f['pods_ms_min']:.1f}-"
              f"{f['pods_ms_max']:.1f}, {f['pods_kb']:.0f} KiB)   PLEG relist "
              f"{f['relist_ms']:7.1f} ms ({f['relist_ms_min']:.1f}-{f['relist_ms_max']:.1f})   "
              f"sync loop lag (1 more pod -> running on the bus) {f['lag_ms']:6.0f} ms "
              f"({f['lag_ms_min']:.0f}-{f['lag_ms_max']:.0f})")


# --- main ----------------------------------------------------------------------------------------

def report_leftovers(what: str, leftovers: list[str]) -> None:
    if leftovers:
        print(f"  WARNING: {what} left processes behind (killed): {leftovers}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="small counts and windows: -n 5 --many 40 --idle-pods 30 "
                         "--idle-seconds 10 --settle 3")
    ap.add_argument("-n", type=int, default=20, help="single-pod and kill samples")
    ap.add_argument("--many", type=int, default=200, help="pods/programs dropped at once")
    ap.add_argument("--idle-pods", type=int, default=110)
    ap.add_argument("--idle-seconds", type=float, default=60.0,
                    help="seconds of each idle window (stage 3; stage 4 takes one)")
    ap.add_argument("--windows", type=int, default=5, help="idle windows of stage 3")
    ap.add_argument("--settle", type=float, default=15.0,
                    help="seconds after all are running before the idle window")
    ap.add_argument("--stages", default="1,2,3")
    ap.add_argument("--json", action="store_true",
                    help="also print the figures of stages 1-3 as one JSON object on the last "
                         "line")
    ap.add_argument("--pull-policy", default="IfNotPresent", choices=["IfNotPresent", "Always"],
                    help="the manifests' imagePullPolicy (Always: a PullImage call per start)")
    ap.add_argument("--scale", default="110,250,1000",
                    help="pod counts of stage 4 (comma-separated)")
    ap.add_argument("--limits", action="store_true",
                    help="CPU and memory limits in every manifest (a cgroup per container)")
    ap.add_argument("--poll-ms", type=float, default=1.0,
                    help="XML-RPC poll interval of the kill -9 stage without the process connector")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.many, args.idle_pods = min(args.n, 5), min(args.many, 40), 30
        args.idle_seconds, args.settle = min(args.idle_seconds, 10.0), 3.0
        args.windows = min(args.windows, 3)
        args.scale = "30,60"
    return args


def run(args: argparse.Namespace, stages: set[str]) -> None:
    if stages & {"1", "2"}:
        agent = Agent(free_port())
        agent.pull_policy = args.pull_policy
        try:
            agent.wait_ready()
            if "1" in stages:
                stage_start(agent, args)
            if "2" in stages:
                stage_kill(agent, args)
        finally:
            report_leftovers("agent", agent.stop())
    if "3" in stages:
        stage_idle(args)
    if "4" in stages:
        stage_scale(args)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    load = os.getloadavg()
    print(f"pods benchmark: {os.cpu_count()} CPUs, load average at start "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (shared machine); manifests: image host, "
          f"imagePullPolicy {args.pull_policy}{', limits (cgroups)' if args.limits else ''}")
    try:
        run(args, set(args.stages.split(",")))
    finally:
        # orphaned monitors exit right after their container: give them a moment
        deadline = time.monotonic() + 10.0
        while alive_descendants() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = kill_descendants()
        if left:
            print(f"WARNING: processes left behind (killed now): {left}")
        load = os.getloadavg()
        print(f"load average at end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if args.json:
        print(json.dumps(JSON_FIGURES, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
