"""The composition root: builds every part of the agent from `Dependencies` and runs it.

Nothing else in `podvisor.supervisor` constructs clocks, spawners, sockets or registries; tests
replace any field of `Dependencies` (a fake spawner, a fake clock, extra control commands,
another list of built-ins).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import zmq

from podvisor.common.config import (
    Config,
    keys_not_yet_used,
    load_config,
    ops_password_path,
    write_config_json,
)
from podvisor.common.logs import setup_logging
from podvisor.common.opspass import ensure_ops_password
from podvisor.ipc.bus import BusProxy, Publisher, Subscriber
from podvisor.ipc.clock import SYSTEM_CLOCK, Clock
from podvisor.ipc.paths import RunPaths
from podvisor.ipc.rlimits import raise_nofile_limit
from podvisor.supervisor.commands import Command, default_commands
from podvisor.supervisor.control import ControlServer
from podvisor.supervisor.core import CoreDeps, Supervisor
from podvisor.supervisor.eventstore import EventStore
from podvisor.supervisor.loop import Agent, AgentParts
from podvisor.supervisor.registry import (
    BUILTINS,
    Builtin,
    ProcessSpec,
    report_builtins,
    resolve_specs,
)
from podvisor.supervisor.spawner import Spawner, new_forkserver_spawner, new_spawner
from podvisor.supervisor.states import StateChange

__all__ = ["AgentLockedError", "Dependencies", "lock_root", "run_agent"]


@dataclass
class Dependencies:
    clock: Clock = SYSTEM_CLOCK  # the one clock of the agent's object graph
    rand: Callable[[], float] = random.random
    spawner: Spawner | None = None  # None: as `supervision.spawnMethod` says
    commands: Mapping[str, Command] = field(default_factory=default_commands)
    builtins: tuple[Builtin, ...] = BUILTINS


class AgentLockedError(RuntimeError):
    """Another agent already runs on this rootDir."""


def lock_root(paths: RunPaths) -> IO[str]:
    """Hold `run/agent.lock` (flock) for as long as the returned file is open: one agent (or
    one `podvisorctl shutdown --pods` without an agent) per rootDir."""
    lock = (paths.run_dir / "agent.lock").open("a+", encoding="utf-8")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        other = lock.read().strip()
        lock.close()
        raise AgentLockedError(
            f"another agent (pid {other or '?'}) runs on {paths.root}") from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def run_agent(
    config_path: Path | None,
    overrides: Mapping[str, Any],
    config: Config,
    deps: Dependencies | None = None,
) -> int:
    """Run the agent in the foreground until SIGTERM/SIGINT/`shutdown`; returns the exit code.
    `config` is the already validated `load_config(config_path, overrides)`."""
    deps = deps or Dependencies()
    nofile = raise_nofile_limit()  # every child inherits it (the runtime holds one per container)
    paths = RunPaths(Path(config.root_dir))
    paths.ensure()
    lock = lock_root(paths)
    _metrics_dir(paths)
    sup_cfg = config.supervision
    log = setup_logging("supervisor", paths.logs_dir, sup_cfg.log_level, sup_cfg.log_max_size,
                        sup_cfg.log_max_files)
    write_config_json(config, paths.config_json)
    if nofile[0] != nofile[1]:
        log.info("supervisor.nofile_raised", soft_was=nofile[0], soft=nofile[1])
    for key, why in keys_not_yet_used(config):
        log.warning("config.key_not_used", key=key, reason=why)

    def resolve(cfg: Config) -> tuple[ProcessSpec, ...]:
        specs = resolve_specs(cfg, deps.builtins)
        # at start and at each reload (one may turn the ops port on): before ops starts
        if cfg.ops_port and ensure_ops_password(ops_password_path(cfg)):
            log.info("ops.password_written", file=str(ops_password_path(cfg)))
        return specs

    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    proxy = BusProxy(zctx, paths)
    proxy.start()
    publisher = Publisher(zctx, paths, "supervisor", clock=deps.clock)
    subscriber = Subscriber(zctx, paths, ["syncloop.pods.stopped", "nodeshutdown.node.done"],
                            clock=deps.clock)
    events_sub = Subscriber(zctx, paths, ["events."], clock=deps.clock)
    events = EventStore(paths.state_dir / "events.jsonl", clock=deps.clock.monotonic)
    events.load()
    agent_box: list[Agent] = []

    def notify(change: StateChange) -> None:
        agent_box[0].publish_change(change)

    def late_after() -> float:
        # the config of now (a reload may have changed the interval the next child reads)
        return LATE_BEATS * agent_box[0].p.config.supervision.heartbeat_interval

    specs = resolve(config)
    report_builtins(config, log, deps.builtins)
    env = {"PODVISOR_ROOT_DIR": str(paths.root), "PODVISOR_SUPERVISOR_PID": str(os.getpid())}
    spawner = deps.spawner or _default_spawner(config, specs)
    core = CoreDeps(deps.clock.monotonic, deps.clock.wall, spawner, notify, log, deps.rand, env,
                    late_after=late_after,
                    on_late=lambda proc, late, age: agent_box[0].publish_late(proc, late, age))
    sup = Supervisor(specs, core)
    parts = AgentParts(
        config=config, sup=sup, zctx=zctx, publisher=publisher, subscriber=subscriber, log=log,
        logs_dir=paths.logs_dir, config_json=paths.config_json,
        heartbeat_endpoint=paths.heartbeat,
        reload_config=lambda: load_config(config_path, overrides),
        resolve=resolve, clock=deps.clock.monotonic, wall=deps.clock.wall, events=events,
        events_sub=events_sub,
        beats_dir=paths.run_dir,
    )
    agent = Agent(parts)
    agent_box.append(agent)
    control = ControlServer(zctx, paths.control, deps.commands, agent, log)
    try:
        return agent.run(control)
    finally:
        sup.kill_all()  # only does something when the loop failed
        spawner.close()
        control.close()
        agent.close()
        publisher.close()
        subscriber.close()
        events_sub.close()
        proxy.stop()
        zctx.destroy(linger=0)
        for endpoint in (paths.control, paths.heartbeat, paths.bus_pub, paths.bus_sub):
            _unlink_ipc(endpoint)
        lock.close()
        sys.stderr.flush()


METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"
# a process is late after this many heartbeat intervals without a beat (said on the bus and on
# the dashboard; the supervisor reads beats once an interval, so two is its normal worst case)
LATE_BEATS = 3


def _metrics_dir(paths: RunPaths) -> None:
    """prometheus-client's multiprocess mode for the children: each writes its metrics to
    mmap files in ``<rootDir>/run/metrics`` (the server's ``/metrics`` sums them). Emptied at
    start (under the root lock: the previous agent's are stale), and set in the environment
    before the forkserver (which imports prometheus_client) or any child starts."""
    import shutil

    directory = paths.run_dir / "metrics"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
    os.environ[METRICS_ENV] = str(directory)


def _default_spawner(config: Config, specs: tuple[ProcessSpec, ...]) -> Spawner:
    if config.supervision.spawn_method == "exec":
        return new_spawner()
    return new_forkserver_spawner([s.module for s in specs])


def _unlink_ipc(endpoint: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(endpoint.removeprefix("ipc://"))
