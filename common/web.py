"""An aiohttp app beside the service loop: what the server and ops processes are made of.

Threads: the main thread runs the process's ``ServiceLoop`` (every zmq socket, the replicas,
the heartbeat, ``ctx.stop``, the injected clock); one web thread runs the asyncio loop (aiohttp
sites, their handlers, their timers and tasks). The two meet at ``WebService.view``: the loop
publishes a new immutable value (``publish``: one attribute swap, atomic under the GIL), the
handlers read it and never touch zmq. ``changed`` (a ``threading.Condition``) is notified on a
publish that says so, for threads that wait for a change (XML-RPC workers); on the web thread,
``await web.next_change(since, timeout)`` waits for one (``changes`` counts them) without a
poll: the publish wakes the event loop (``call_soon_threadsafe``) only while someone waits.

Use::

    web = WebService(ctx, View(), batch=0.5)           # its loop: web.loop
    maps = SomeReplicas(web.loop, web.publish)          # declares replicas on web.loop
    web.run(serve, maps.drain)                          # until ctx.stop; then the sites stop

``serve(web)`` is a coroutine run on the web thread at start: it starts the sites
(``await web.site(app, host, port)``) and may schedule timers (``web.later``) and tasks
(``web.spawn``); every one of them is cancelled, awaited or cleaned up at stop.
``drain(now)`` runs on the main thread after every poll that pumped whatever the replicas had
queued: it publishes a new value when something moved.

Lazy (``batch`` > 0): replica traffic waits (queued in zmq) until ``batch`` after the previous
pump, unless a handler asks for a fresh value (``await web.refresh()``: the loop pumps at once
and hands back the value, or the current one at once when the loop is blocked with nothing
queued). A burst of updates is drained per request or per ``batch``, not once per update.

Heartbeat: the loop sends it, but only while the web thread's event loop turns (a timer on it
stamps the clock every heartbeat interval; older than two intervals, the loop stays silent):
a handler that blocks the event loop makes the process hang as far as the supervisor can tell,
which restarts it, as when the heartbeat came from that event loop.

Dying: if the web thread dies (a site that cannot start, a crash) the loop raises ``WebDied``
at once (the thread wakes it) and the process exits with an error, so the supervisor restarts
it; if the main loop dies the process exits and takes the (daemon) web thread with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import ssl
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

from aiohttp import web

from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop, WakePipe

__all__ = ["Serve", "WebDied", "WebService"]

V = TypeVar("V")
Serve = Callable[["WebService[Any]"], Awaitable[None]]
REFRESH_TIMEOUT = 2.0  # a handler waits at most this long for a drain (then: the last value)
JOIN_TIMEOUT = 10.0  # the web thread's stop (open connections get their shutdown timeout)


class WebDied(RuntimeError):
    pass


class WebService(Generic[V]):
    """A ``ServiceLoop`` (main thread) and an aiohttp web thread. See the module docstring."""

    def __init__(self, ctx: ChildContext, view: V, *, batch: float = 0.0,
                 name: str = "web") -> None:
        self.ctx = ctx
        self.loop = ServiceLoop(ctx)
        self.view = view  # the latest published value (any thread reads it)
        self.changed = threading.Condition()
        self.batch = batch
        self.name = name
        self.error: BaseException | None = None  # what ended the web thread
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[V]]] = []
        self.changes = 0  # publishes marked changed so far (``next_change``)
        self._watchers: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[V]]] = []
        self._wake = WakePipe()  # a handler's refresh, the web thread's end
        self.loop.watch(self._wake.read_fd, self._wake.drain)
        self._thread: threading.Thread | None = None
        self._drain: Callable[[float], object] = lambda now: None
        # the web thread's own (touched on it only, but for the stop request)
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._stopping = False
        self._closed = False
        self._runners: list[web.AppRunner] = []
        self._timers: list[asyncio.TimerHandle] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._web_beat = -math.inf  # when the web thread's event loop last turned (monotonic)
        self.loop.beat_while(self._web_alive)

    # --- main thread ------------------------------------------------------------------------
    def publish(self, view: V, changed: bool = True) -> None:
        """Hand ``view`` to the handlers; ``changed``: count it in ``changes``, notify
        ``changed``'s waiters and wake the web thread's ``next_change`` callers."""
        self.view = view
        if changed:
            with self._lock:
                self.changes += 1
                watchers, self._watchers = self._watchers, []
            for aloop, fut in watchers:
                with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                    aloop.call_soon_threadsafe(_resolve, fut, view)
            with self.changed:
                self.changed.notify_all()

    def _web_alive(self, now: float) -> bool:
        """The web thread's event loop turned within two heartbeat intervals (or there is no
        web thread yet): a stalled event loop silences the process's heartbeat, as when the
        heartbeat came from that loop."""
        return self._thread is None or now - self._web_beat <= 2 * self.ctx.heartbeat_interval

    def step(self, now: float) -> float | None:
        """The loop's step: a dead web thread ends the loop; after a poll that pumped what was
        queued, ``drain`` and answer the handlers waiting for a fresh value; then hold the
        replicas' traffic for ``batch`` unless a handler waits."""
        if self._thread is not None and not self._thread.is_alive():
            raise WebDied(f"{self.name} web thread died: {self.error!r}") from self.error
        if not self.loop.holding:
            self._drain(now)
            self._answer()
        with self._lock:
            asked = bool(self._waiters)
        if asked:  # the next poll pumps at once
            self.loop.hold(-math.inf)
            return now
        if self.batch > 0:
            self.loop.hold(self.loop.last_pump + self.batch)
        return None

    def run(self, serve: Serve, drain: Callable[[float], object]) -> None:
        """Start the web thread with ``serve``, turn the loop until ``ctx.stop``, then stop the
        web thread (its sites, timers and tasks)."""
        self.start(serve, drain)
        try:
            self.loop.run(self.step)
        finally:
            self.stop()

    def start(self, serve: Serve, drain: Callable[[float], object]) -> None:
        """Start the web thread with ``serve``; ``drain`` runs on the loop (see ``step``)."""
        self._drain = drain
        self._web_beat = self.loop.clock.monotonic()  # the thread gets its first intervals
        self._thread = threading.Thread(target=self._web_main, args=(serve,),
                                        name=f"{self.name}-web", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = JOIN_TIMEOUT) -> None:
        with self._lock:
            self._stopping = True
            aloop, event = self._aloop, self._stop_event
        if aloop is not None and event is not None:
            with contextlib.suppress(RuntimeError):  # that loop is closed already
                aloop.call_soon_threadsafe(event.set)
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)

    def close(self) -> None:
        self.stop()
        self._closed = True
        self._answer()
        self.loop.close()
        self._wake.close()

    def _answer(self) -> None:
        """Hand the current value to the handlers waiting for a drain."""
        with self._lock:
            waiters, self._waiters = self._waiters, []
        view = self.view
        for aloop, fut in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                aloop.call_soon_threadsafe(_resolve, fut, view)

    # --- web thread -------------------------------------------------------------------------
    def stopping(self) -> bool:
        """The process is stopping (handlers end long responses, e.g. a followed log)."""
        return self._stopping or self.ctx.stop.is_set()

    async def refresh(self, timeout: float = REFRESH_TIMEOUT) -> V:
        """A value holding every update queued when this was called: the current one when the
        loop is blocked with nothing queued, else the one of a drain the loop makes at once."""
        if self.loop.idle or self._closed or (
                self._thread is not None and not self._thread.is_alive()):
            return self.view  # nothing queued, or nobody left to drain it
        aloop = asyncio.get_running_loop()
        fut: asyncio.Future[V] = aloop.create_future()
        with self._lock:
            self._waiters.append((aloop, fut))
        self._wake.wake()
        late = aloop.call_later(timeout, lambda: _resolve(fut, self.view))
        try:
            return await fut
        finally:
            late.cancel()

    async def next_change(self, since: int, timeout: float) -> int:
        """``changes`` once it differs from ``since`` (at once if it does already), or after
        ``timeout`` seconds without a change. Web thread only; no poll: a changed publish
        wakes the waiter."""
        aloop = asyncio.get_running_loop()
        fut: asyncio.Future[V] = aloop.create_future()
        with self._lock:
            if self.changes != since or self._closed:
                return self.changes
            self._watchers.append((aloop, fut))
        try:
            await asyncio.wait((fut,), timeout=max(0.0, timeout))
        finally:
            with self._lock, contextlib.suppress(ValueError):  # resolved: already taken
                self._watchers.remove((aloop, fut))
        return self.changes

    async def site(self, app: web.Application, host: str, port: int, *,
                   ssl_context: ssl.SSLContext | None = None,
                   shutdown_timeout: float = 2.0) -> web.AppRunner:
        """Serve ``app`` on ``host``:``port`` until the stop (raises ``OSError`` when the
        address cannot be bound; nothing is left behind then)."""
        runner = web.AppRunner(app, access_log=None, handle_signals=False,
                               shutdown_timeout=shutdown_timeout)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port, reuse_address=True,
                              ssl_context=ssl_context).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runners.append(runner)
        return runner

    def later(self, delay: float, callback: Callable[[], object]) -> None:
        """Run ``callback`` on the web thread in ``delay`` seconds (cancelled at stop)."""
        assert self._aloop is not None
        self._timers = [t for t in self._timers if not t.cancelled()
                        and t.when() > self._aloop.time()]
        self._timers.append(self._aloop.call_later(delay, callback))

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` on the web thread (awaited at stop, before the sites close)."""
        assert self._aloop is not None
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(self._aloop.create_task(coro))

    def _web_main(self, serve: Serve) -> None:
        try:
            asyncio.run(self._serve(serve))
        except BaseException as err:  # reported to the main thread, which exits
            self.error = err
        finally:
            self._wake.wake()  # the loop sees the thread gone at once

    async def _serve(self, serve: Serve) -> None:
        event = asyncio.Event()
        with self._lock:
            self._aloop, self._stop_event = asyncio.get_running_loop(), event
            if self._stopping:
                event.set()
        self._beat()
        try:
            await serve(self)
            await event.wait()
        finally:
            for timer in self._timers:
                timer.cancel()
            for task in self._tasks:
                await task
            for runner in reversed(self._runners):
                await runner.cleanup()
            self._runners.clear()

    def _beat(self) -> None:
        """Every heartbeat interval on the web thread: its event loop turns."""
        assert self._aloop is not None
        self._web_beat = self.loop.clock.monotonic()
        self._timers.append(self._aloop.call_later(self.ctx.heartbeat_interval, self._beat))
        self._timers = [t for t in self._timers if not t.cancelled()
                        and t.when() > self._aloop.time()]


def _resolve(fut: asyncio.Future[V], view: V) -> None:
    if not fut.done():
        fut.set_result(view)
