"""What a service's ``run(ctx)`` gets: ``ChildContext`` (name, config, paths, logger, zmq
context, the stop event, the heartbeat and the process's one clock) and ``StopEvent``; and
``FakeChildContext``, the one a test builds to run a service in its own process.

The process entry point that builds the real one is ``podvisor.supervisor.child``."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq

from podvisor.common.config import Config
from podvisor.common.logs import EventLog, MemoryLogger
from podvisor.ipc.clock import SYSTEM_CLOCK, Clock
from podvisor.ipc.paths import RunPaths

__all__ = ["ChildContext", "FakeChildContext", "StopEvent"]


class StopEvent(threading.Event):
    """A ``threading.Event`` that a poller can wait on: once set, ``fileno()`` is readable (and
    stays so). Loops register it beside their sockets and block until their next real deadline,
    yet see a stop at once (a signal handler setting it writes the pipe, so a zmq poll that
    resumes after the EINTR returns immediately)."""

    def __init__(self) -> None:
        super().__init__()
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def fileno(self) -> int:
        return self._r

    def set(self) -> None:
        super().set()
        with contextlib.suppress(OSError):  # full: readable already
            os.write(self._w, b"x")


@dataclass
class ChildContext:
    """What a service's `run(ctx)` gets. Use from the main thread (`heartbeat` is not
    thread-safe; `stop` is)."""

    name: str
    config: Config
    paths: RunPaths
    log: EventLog
    zctx: zmq.Context[zmq.Socket[bytes]]
    stop: threading.Event = field(default_factory=StopEvent)
    beat: Callable[[], object] | None = None
    clock: Clock = SYSTEM_CLOCK  # the process's one clock: every deadline is computed on it

    @property
    def stop_fd(self) -> int | None:
        """A file descriptor readable once ``stop`` is set (None for a plain Event): register it
        in a poller so a long wait ends at once on stop."""
        fileno = getattr(self.stop, "fileno", None)
        return fileno() if callable(fileno) else None

    @property
    def heartbeat_interval(self) -> float:
        """The longest a main loop may block between two ``heartbeat()`` calls."""
        return float(self.config.supervision.heartbeat_interval)

    def heartbeat(self) -> None:
        """Tell the supervisor this process is alive. Cheap and rate-limited: call it from the
        main loop at least every `supervision.heartbeatInterval` (default 1 s)."""
        if self.beat is not None:
            self.beat()

    def sleep(self, seconds: float) -> bool:
        """Wait up to `seconds`, heartbeating meanwhile; True as soon as `stop` is set."""
        deadline = self.clock.monotonic() + seconds
        step = max(0.01, self.heartbeat_interval)
        while True:
            self.heartbeat()
            left = deadline - self.clock.monotonic()
            if left <= 0:
                return self.stop.is_set()
            if self.stop.wait(min(step, left)):
                return True


class FakeChildContext(ChildContext):
    """A ``ChildContext`` for a test that runs a service in its own process: the real one's
    fields and methods (``dataclasses.replace`` too), built from the run directory alone.

    Records: ``log`` is a ``MemoryLogger`` (``ctx.log.events``), ``beats`` counts the
    ``heartbeat()`` calls. Knobs: ``config`` (default: the defaults with ``rootDir`` at
    ``paths.root``), ``heartbeat_interval`` (replaces its ``supervision.heartbeatInterval``),
    ``clock`` (the process's one clock: ``SYSTEM_CLOCK``, as in the real one, unless the test
    drives the service on a ``FakeClock``), ``zctx`` (default: the process's shared context),
    ``stop`` (default: a fresh ``StopEvent``), ``log``, ``beat`` (called after each counted
    heartbeat). A copy made with ``dataclasses.replace`` shares the log and the count."""

    log: MemoryLogger

    def __init__(self, paths: RunPaths, name: str = "test", *, config: Config | None = None,
                 heartbeat_interval: float | None = None, clock: Clock = SYSTEM_CLOCK,
                 zctx: zmq.Context[zmq.Socket[bytes]] | None = None,
                 stop: threading.Event | None = None, log: MemoryLogger | None = None,
                 beat: Callable[[], object] | None = None) -> None:
        if config is None:
            config = Config(root_dir=str(paths.root))
        if heartbeat_interval is not None:
            config = dataclasses.replace(config, supervision=dataclasses.replace(
                config.supervision, heartbeat_interval=heartbeat_interval))
        counter = beat if isinstance(beat, _BeatCounter) else _BeatCounter(beat)
        self._counter = counter
        super().__init__(name, config, paths, MemoryLogger() if log is None else log,
                         zmq.Context.instance() if zctx is None else zctx,
                         StopEvent() if stop is None else stop, counter, clock)

    @property
    def beats(self) -> int:
        """How many times ``heartbeat()`` was called."""
        return self._counter.count


class _BeatCounter:
    """``FakeChildContext``'s heartbeat: counts, then calls ``then`` (if any)."""

    def __init__(self, then: Callable[[], object] | None) -> None:
        self.count = 0
        self.then = then

    def __call__(self) -> None:
        self.count += 1
        if self.then is not None:
            self.then()
