"""`podvisorctl --root-dir DIR shutdown --pods` when no agent answers: stop the pods directly.

The agent leaves pods running when it stops (as the kubelet does) and says how to stop them.
With no agent, this stops them itself, through the runtime the agent used: the rootDir records
it in `run/config.json` (the effective config, written at every start and reload and kept after
the agent exits): `runtimeEndpoint` (and `cgroupRoot`, `runtimeRequestTimeout`). For the
embedded runtime it starts the runtime service in this process on `run/cri.sock` over the state
in `runtime/`, exactly as the agent's `runtime` process does, and stops it afterwards (containers
are owned by their monitors, not by the service). Another runtime (containerd) may run other
clients' pods: there only the pods this rootDir's agent made are touched (those with a log
directory under `pod-logs/`). Every pod is then terminated as the sync loop terminates an
orphan (`podvisor.services.syncloop.stopall`): SIGTERM, its grace, SIGKILL; sandboxes and
containers removed; `pods/<uid>` and pod cgroup folders removed.

While it works it holds `run/agent.lock`, so no agent can start on the rootDir meanwhile; an
agent that holds the lock but does not answer is reported (exit 2), never bypassed. Logs go to
`logs/podvisorctl.log`; stdout says what was stopped.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import TextIO

from podvisor.common.config import Config, ConfigError, run_config
from podvisor.common.endpoint import EMBEDDED, cri_endpoint, is_embedded
from podvisor.common.logs import EventLogger, setup_logging
from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.paths import RunPaths
from podvisor.supervisor.app import AgentLockedError, lock_root

__all__ = ["main_stop_pods"]


def _serving(paths: RunPaths) -> bool:
    """Whether an embedded runtime already serves `run/cri.sock` (the runtime process of an
    agent killed -9 lives on until its parent-death SIGTERM ends it): then it is used, never
    doubled by a second one over the same state."""
    from podvisor.services.cri import CriError, new_runtime_client

    if not paths.cri_socket.exists():
        return False
    cri = new_runtime_client(cri_endpoint(EMBEDDED, paths.cri_socket), timeout=1.0)
    try:
        cri.version()
    except CriError:
        return False
    finally:
        cri.close()
    return True


def _has_embedded_state(paths: RunPaths) -> bool:
    return paths.runtime_dir.is_dir() and any(paths.runtime_dir.iterdir())


def _stop(paths: RunPaths, config: Config | None, log: EventLogger) -> int:
    from podvisor.services.cri import CriError, new_runtime_client
    from podvisor.services.runtime import serve_in_process
    from podvisor.services.syncloop import (
        owned_pod_uids,
        pod_cgroups,
        runtime_pods,
        stop_all_pods,
    )

    endpoint = config.runtime_endpoint if config is not None else EMBEDDED
    timeout = config.runtime_request_timeout if config is not None else 120.0
    cgroups = pod_cgroups(config.cgroup_root if config is not None else "", log)
    if is_embedded(endpoint) and not _has_embedded_state(paths):
        print(f"no pods: the embedded runtime never ran on {paths.root}")
        return 0
    embedded = is_embedded(endpoint)
    with contextlib.ExitStack() as stack:
        if embedded and _serving(paths):
            endpoint = cri_endpoint(EMBEDDED, paths.cri_socket)
            log.info("ctl.runtime_serving", socket=str(paths.cri_socket))
        elif embedded:  # served here, as the agent's runtime process would
            try:
                stack.enter_context(serve_in_process(paths.runtime_dir, paths.cri_socket, log))
            except Exception as exc:
                print(f"podvisorctl: the embedded runtime did not start: {exc}",
                      file=sys.stderr)
                return 1
            endpoint = cri_endpoint(EMBEDDED, paths.cri_socket)
        cri = new_runtime_client(endpoint, timeout=timeout)
        stack.callback(cri.close)
        log.info("ctl.stop_pods", endpoint=endpoint)
        # the embedded runtime's state is this rootDir's alone; any other runtime may hold
        # other clients' pods: only the pods this rootDir's agent made are stopped
        only = None if embedded else owned_pod_uids(paths.pod_logs_dir)
        try:
            others = 0 if only is None else len(set(runtime_pods(cri)) - only)
            results = stop_all_pods(cri, log, paths.pods_dir, cgroups, time.sleep,
                                    SYSTEM_CLOCK.monotonic, SYSTEM_CLOCK.wall, only)
        except CriError as err:
            print(f"podvisorctl: cannot list the pods at {endpoint}: {err}", file=sys.stderr)
            return 1
    failed = [r for r in results if not r.ok]
    for r in results:
        what = f"{r.name or '(unnamed)'} (uid {r.uid})"
        if r.ok:
            noun = "container" if r.containers == 1 else "containers"
            print(f"stopped pod {what}: {r.containers} running {noun}, grace {r.grace:g}s")
        else:
            print(f"podvisorctl: could not stop pod {what}: {r.error}", file=sys.stderr)
    stopped = len(results) - len(failed)
    print(f"stopped {stopped} {'pod' if stopped == 1 else 'pods'} (no agent was running; "
          f"asked the runtime at {endpoint} directly)")
    if others:
        print(f"left {others} other {'pod' if others == 1 else 'pods'} of that runtime alone "
              f"(not made by the agent of {paths.root})")
    log.info("ctl.pods_stopped", pods=stopped, failed=len(failed))
    return 1 if failed else 0


def main_stop_pods(root: str) -> int:
    """Exit 0 when every pod was stopped (or there were none), 1 when some could not be, 2
    when the rootDir is missing or an agent holds it without answering."""
    paths = RunPaths(Path(root))
    if not paths.run_dir.is_dir():
        print(f"podvisorctl: no podvisor rootDir at {root} (no {paths.run_dir})",
              file=sys.stderr)
        return 2
    try:
        lock = lock_root(paths)
    except AgentLockedError as exc:
        print(f"podvisorctl: the agent is not answering but holds the rootDir ({exc}); "
              "its pods were not touched", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"podvisorctl: cannot lock {paths.run_dir}: {exc}", file=sys.stderr)
        return 2
    try:
        config = run_config(paths.config_json)
    except (ConfigError, OSError, ValueError) as exc:
        print(f"podvisorctl: cannot read {paths.config_json}: {exc}", file=sys.stderr)
        lock.close()
        return 2
    devnull: TextIO = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115
    try:
        log = setup_logging("podvisorctl", paths.logs_dir, stream=devnull)
        return _stop(paths, config, log)
    finally:
        devnull.close()
        lock.close()
