"""The Evented PLEG input: GetContainerEvents consumed on a thread (kubelet ``EventedPLEG``).

``EventWatcher`` keeps one stream open, puts every event in a bounded queue (a full queue drops
and counts the event; nothing is lost for good because the main loop relists on every wake-up)
and makes ``wake_fd`` readable so the main loop, which polls zmq sockets and this fd together,
wakes at once. The queue is a deque (appends and pops are atomic), and the pipe is written only
when the main loop has not been woken since its last ``drain``: a burst costs one write and one
wake-up per drain, not one per event. When the stream fails it reports ``streaming = False``
(the main loop then relists every second) and retries with back-off (1 s doubling to 30 s);
UNIMPLEMENTED (containerd 1.6) stops the retries for the life of the process.

Thread-safety: ``drain``, ``streaming``, ``dropped`` and ``stop`` are safe from the main thread;
the watcher thread never touches zmq.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from collections import deque
from typing import Any

from podvisor.common.logs import EventLog
from podvisor.services.cri import CriError, EventStream, RuntimeClient

QUEUE_SIZE = 1000
RETRY_BASE = 1.0
RETRY_CAP = 30.0
GRPC_WAIT_SLICE = 60.0


def unslice_grpc_waits(seconds: float = GRPC_WAIT_SLICE) -> None:
    """gRPC's blocking iterators wait in 0.1 s slices (``grpc._common.MAXIMUM_WAIT_TIMEOUT``) so
    that signal handlers run on a main thread blocked in them: an idle stream's consumer thread
    woke 10 times a second. Lock waits are interruptible by signals in Python 3 anyway, and
    nothing here blocks the main thread on a stream: wait in ``seconds`` slices instead."""
    with contextlib.suppress(Exception):  # a gRPC without the knob: keep its slices
        common = importlib.import_module("grpc._common")
        current = getattr(common, "MAXIMUM_WAIT_TIMEOUT", None)
        if isinstance(current, float):
            setattr(common, "MAXIMUM_WAIT_TIMEOUT", max(current, seconds))  # noqa: B010


class EventWatcher:
    def __init__(
        self, client: RuntimeClient, log: EventLog, maxsize: int = QUEUE_SIZE,
        retry_base: float = RETRY_BASE, retry_cap: float = RETRY_CAP,
    ) -> None:
        self._client = client
        self._log = log
        self._queue: deque[Any] = deque()
        self._maxsize = maxsize
        self._woken = False  # the pipe was written since the last drain
        self._retry_base = retry_base
        self._retry_cap = retry_cap
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stream: EventStream | None = None
        self._streaming = False
        self.unsupported = False
        self.dropped = 0
        self.received = 0
        self._rfd, self._wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="pleg-events", daemon=True)

    @property
    def wake_fd(self) -> int:
        return self._rfd

    @property
    def streaming(self) -> bool:
        return self._streaming

    def start(self) -> None:
        unslice_grpc_waits()
        self._thread.start()

    def drain(self) -> list[Any]:
        """Every queued event (oldest first); clears the wake-up fd."""
        try:
            while os.read(self._rfd, 4096):
                pass
        except BlockingIOError:
            pass
        # cleared after the pipe is emptied and before the queue is: an event put before this
        # point is taken below; one put after it writes the pipe again (so the loop wakes for
        # it). Cleared before the read, a write racing the read could be swallowed with the
        # flag left set, and no later event would wake the loop.
        self._woken = False
        out: list[Any] = []
        while True:
            try:
                out.append(self._queue.popleft())
            except IndexError:
                return out

    def _wake(self) -> None:
        if self._woken:
            return  # written since the last drain: the loop will take this item with it
        self._woken = True
        # a full pipe means the main loop is awake already; a closed one that we are stopping
        with contextlib.suppress(OSError):
            os.write(self._wfd, b"x")

    def _put(self, item: Any) -> None:
        if len(self._queue) < self._maxsize:  # one producer: the length only shrinks meanwhile
            self._queue.append(item)
        else:
            self.dropped += 1
        self._wake()

    def _set_streaming(self, value: bool) -> None:
        if self._streaming != value:
            self._streaming = value
            self._log.info("pleg.events_mode", mode="stream" if value else "relist")
            self._put(None)  # a mode change makes the loop relist at once

    def _consume_once(self) -> None:
        stream = self._client.container_events()
        with self._lock:
            if self._stop.is_set():
                stream.close()
                return
            self._stream = stream
        try:
            # "streaming" (the loop relists once, then trusts the events) only once the
            # runtime has the subscription: an event between that relist and the subscription
            # would be lost until the next fallback relist (30 s)
            stream.wait_subscribed()
            if self._stop.is_set():
                return
            self._set_streaming(True)
            for event in stream:
                self.received += 1
                self._put(event)
        finally:
            with self._lock:
                self._stream = None
            stream.close()  # on this thread: a stream's resources belong to its reader

    def _run(self) -> None:
        delay = self._retry_base
        while not self._stop.is_set():
            received = self.received
            try:
                self._consume_once()
                if self._stop.is_set():
                    break
                self._log.warning("pleg.events_stream_ended")
            except CriError as err:
                if err.unimplemented:
                    self.unsupported = True
                    self._log.info("pleg.events_unsupported", error=str(err))
                    self._set_streaming(False)
                    return
                self._log.warning("pleg.events_stream_failed", error=str(err), retry_in=delay)
            except Exception as err:  # never let the watcher die silently
                self._log.error("pleg.events_stream_error", error=repr(err), retry_in=delay)
            self._set_streaming(False)
            if self.received > received:
                delay = self._retry_base  # the stream worked for a while: retry soon
            if self._stop.wait(delay):
                break
            delay = min(self._retry_cap, delay * 2)
        self._set_streaming(False)

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.close()
        if self._thread.is_alive():
            self._thread.join(timeout)
        for fd in (self._rfd, self._wfd):
            with contextlib.suppress(OSError):
                os.close(fd)
