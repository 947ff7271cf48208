"""The entry point of every supervised process: `python -m podvisor.supervisor.child NAME`.

What a service gets (`ChildContext`, `StopEvent`, the service loop) is in `podvisor.common`;
this module is the supervisor's side of the harness: it builds the context and runs the service.

Start-up order: set PR_SET_PDEATHSIG (SIGTERM) and check the parent is still the supervisor;
read `run/config.json`; set up JSON logging to stderr and `logs/<NAME>.log`; install the SIGTERM
handler (it only sets `ctx.stop`, and arms an alarm so a child whose service ignores the stop
still dies when its supervisor is gone) and ignore SIGINT (a terminal's Ctrl-C is the
supervisor's to handle); import the service module; send `ready`; call
`run(ctx)`. Exit status: 0 when `run` returns, 1 (with a `child.crashed` event carrying the
traceback) when it raises, or the code given to `sys.exit`.

The supervisor passes, in the environment: `PODVISOR_ROOT_DIR`, `PODVISOR_MODULE` (the module with
`run(ctx)`), `PODVISOR_SUPERVISOR_PID` and `PODVISOR_STOP_TIMEOUT` (seconds).
"""

from __future__ import annotations

import ctypes
import math
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` to this process when its parent (thread) exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _early_start() -> None:
    set_parent_death_signal()
    expected = os.environ.get("PODVISOR_SUPERVISOR_PID")
    if expected and os.getppid() != int(expected):
        # The supervisor died before the death signal was armed.
        os._exit(3)


if __name__ == "__main__":
    _early_start()

import importlib  # noqa: E402
import threading  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from types import FrameType  # noqa: E402

import zmq  # noqa: E402

from podvisor.common.child import ChildContext, StopEvent  # noqa: E402
from podvisor.common.config import read_config_json  # noqa: E402
from podvisor.common.logs import setup_logging  # noqa: E402
from podvisor.ipc.clock import SYSTEM_CLOCK  # noqa: E402
from podvisor.ipc.paths import RunPaths  # noqa: E402
from podvisor.supervisor.heartbeat import HeartbeatSender, beat_file  # noqa: E402

__all__ = ["ChildContext", "StopEvent", "forked_main", "main", "set_parent_death_signal"]

PR_SET_NAME = 15
# Beats go out at most this fraction of `heartbeatInterval` apart: a loop that wakes once per
# interval beats every time, a busy one about once per interval (not on every turn).
BEAT_RATE = 0.9


def _install_signals(stop: threading.Event, stop_timeout: float) -> None:
    alarm = max(1, math.ceil(stop_timeout) + 1)

    def on_stop(signum: int, frame: FrameType | None) -> None:
        if not stop.is_set():
            stop.set()
            signal.alarm(alarm)  # default SIGALRM action ends us if the service ignores stop

    signal.signal(signal.SIGTERM, on_stop)
    # A terminal's Ctrl-C reaches the whole foreground process group. Only the supervisor acts
    # on SIGINT: it stops its children in reverse start order with SIGTERM (so the runtime is
    # still up while the others stop, and the agent can count the pods it leaves running).
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_service(ctx: ChildContext, module_name: str, send_ready: Callable[[], object]) -> int:
    try:
        module = importlib.import_module(module_name)
        run = module.run
    except BaseException:
        ctx.log.exception("child.import_failed", module=module_name)
        return 1
    send_ready()
    ctx.log.info("child.started", module=module_name, pid=os.getpid())
    try:
        run(ctx)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        ctx.log.info("child.exit", code=code)
        return code
    except BaseException:
        ctx.log.exception("child.crashed", module=module_name)
        return 1
    ctx.log.info("child.returned", stopping=ctx.stop.is_set())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m podvisor.supervisor.child NAME", file=sys.stderr)
        return 2
    name = args[0]
    root = os.environ.get("PODVISOR_ROOT_DIR", "")
    module_name = os.environ.get("PODVISOR_MODULE", f"podvisor.services.{name}.main")
    stop_timeout = float(os.environ.get("PODVISOR_STOP_TIMEOUT", "5"))
    stop = StopEvent()
    _install_signals(stop, stop_timeout)
    paths = RunPaths(Path(root))
    try:
        config = read_config_json(paths.config_json)
    except (OSError, ValueError) as exc:
        print(f"podvisor child {name}: cannot read {paths.config_json}: {exc}", file=sys.stderr)
        return 1
    sup = config.supervision
    log = setup_logging(name, paths.logs_dir, sup.log_level, sup.log_max_size, sup.log_max_files)
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sender = HeartbeatSender(zctx, paths.heartbeat, name, os.getpid(),
                             BEAT_RATE * sup.heartbeat_interval, SYSTEM_CLOCK.monotonic,
                             beat_path=beat_file(paths.run_dir, name))
    ctx = ChildContext(name, config, paths, log, zctx, stop, sender.beat)
    try:
        return _run_service(ctx, module_name, sender.ready)
    finally:
        sender.close()
        zctx.destroy(linger=0)


def forked_main(name: str, env: dict[str, str]) -> None:
    """Entry point in a child forked by the forkserver spawner (the harness is preloaded)."""
    parent = os.getppid()
    set_parent_death_signal()
    if os.getppid() != parent:
        os._exit(3)
    os.environ.update(env)
    libc = ctypes.CDLL(None)
    libc.prctl(PR_SET_NAME, ctypes.c_char_p(f"pv-{name}"[:15].encode()), 0, 0, 0)
    sys.exit(main([name]))


if __name__ == "__main__":
    sys.exit(main())
