"""A thread pool that gives its threads back: ``concurrent.futures.ThreadPoolExecutor``'s
behaviour (bounded, reuses an idle thread before it starts one, non-daemon threads that finish
their item when the interpreter exits) plus one thing it lacks: a thread idle for
``idle_timeout`` seconds exits.

Why: the standard pool never shrinks. After 110 pods started at once the sync loop kept 113
threads and the runtime's gRPC server 47 for the rest of their lives, each with its stack and
interpreter state. Here they exit after the burst (~15 threads per process at 110 idle pods)
and start again for the next one (start + join of a thread: ~0.09 ms here). Resident memory
barely changes (~3 MB of ~210 for the agent): a burst's heap stays with the interpreter.

The idle timeout is a real-time wait inside the pool (``queue.get(timeout=...)``), not a
decision of the program's own: no injected clock.
"""

from __future__ import annotations

import itertools
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

__all__ = ["ElasticPool"]

P = ParamSpec("P")
T = TypeVar("T")
IDLE_TIMEOUT = 10.0

_Item = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]
_pools: weakref.WeakSet[ElasticPool] = weakref.WeakSet()
_exiting = False


def _at_exit() -> None:
    """As ThreadPoolExecutor at interpreter exit: idle threads go now, busy ones after their
    item (threading's shutdown then joins them)."""
    global _exiting
    _exiting = True
    for pool in list(_pools):
        pool.shutdown(wait=False)


getattr(threading, "_register_atexit", lambda _fn: None)(_at_exit)


class ElasticPool(Executor):
    """At most ``max_workers`` threads named ``<prefix>_<n>``; one idle for ``idle_timeout``
    seconds exits. Thread-safe."""

    _counter = itertools.count()

    def __init__(self, max_workers: int, thread_name_prefix: str = "",
                 idle_timeout: float = IDLE_TIMEOUT) -> None:
        if max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        self._max = max_workers
        self._prefix = thread_name_prefix or f"ElasticPool-{next(self._counter)}"
        self._idle_timeout = idle_timeout
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # one token per thread waiting for work
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._names = itertools.count()
        self._shutdown = False
        _pools.add(self)

    @property
    def threads(self) -> int:
        """Threads alive now (started and not yet exited)."""
        with self._lock:
            return len(self._threads)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown or _exiting:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.put((future, fn, args, kwargs))
            # an idle thread takes it (its token is ours now); else start one, within the bound
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max:
                thread = threading.Thread(target=self._work,
                                          name=f"{self._prefix}_{next(self._names)}")
                self._threads.add(thread)
                thread.start()
        return future

    def _next(self) -> _Item | None:
        """The next item; queue.Empty after ``idle_timeout`` without one."""
        return self._queue.get(timeout=self._idle_timeout)

    def _work(self) -> None:
        me = threading.current_thread()
        try:
            while True:
                try:
                    item = self._next()
                except queue.Empty:
                    with self._lock:
                        # exit only with a token back: none left means a submit just counted
                        # on this thread, and its item is in the queue
                        if self._idle.acquire(blocking=False):
                            self._threads.discard(me)  # under the lock: submit counts right
                            return
                    continue
                if item is None:  # shutdown: pass it on to the next thread
                    self._queue.put(None)
                    return
                future, fn, args, kwargs = item
                if future.set_running_or_notify_cancel():
                    try:
                        result = fn(*args, **kwargs)
                    except BaseException as exc:
                        future.set_exception(exc)
                    else:
                        future.set_result(result)
                del item, future, fn, args, kwargs
                self._idle.release()
        finally:
            with self._lock:
                self._threads.discard(me)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        self._queue.put(None)  # each exiting thread passes it on
        if wait:
            for thread in threads:
                thread.join()
