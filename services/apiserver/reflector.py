"""List + watch of one collection, as client-go's reflector does it (KUBELET.md, "API server
membership"): list, then watch from the list's ``resourceVersion`` with
``allowWatchBookmarks``; every event and bookmark moves the version on; a watch that ends
(server timeout, ``timeoutSeconds`` randomised in [t, 2t), a cut connection) resumes from the
last version without a relist; ``410 Gone`` (an ERROR event or an HTTP answer) means relist.
Failures back off 0.8 s doubling to ``max_delay``, reset by a successful list or watch event;
``retry()`` cuts a back-off short (another request of the process got an answer: the server is
back, so the next attempt goes now rather than when the doubled delay ends).

Runs on its own thread (``start``/``stop``); the sink methods are called on that thread.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from podvisor.services.apiserver.client import (
    ApiConnection,
    ApiError,
    ApiUnreachable,
    Obj,
    WatchStream,
)
from podvisor.services.apiserver.meta import ApiMeta

INITIAL_DELAY = 0.8


class Sink(Protocol):
    """``event`` gets ADDED/MODIFIED/DELETED and BOOKMARK (an object with only
    ``metadata.resourceVersion``: the set is unchanged, the version moves on)."""

    def listed(self, items: list[Obj], rv: str) -> None: ...
    def event(self, kind: str, obj: Obj) -> None: ...
    def failed(self, why: str) -> None: ...


@dataclass
class Reflector:
    conn: ApiConnection
    path: str
    query: Mapping[str, str]
    sink: Sink
    watch_timeout: float = 300.0
    max_delay: float = 30.0
    initial_delay: float = INITIAL_DELAY
    rng: Callable[[], float] = random.random
    stop_event: threading.Event = field(default_factory=threading.Event)
    _wakeup: threading.Event = field(default_factory=threading.Event)  # stop or retry
    rv: str = ""
    lists: int = 0
    watches: int = 0
    _stream: WatchStream | None = None
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="reflector", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        """Stop without waiting (any thread, the reflector's own included): the open watch is
        cut at once and the thread ends (after a list in flight, if any)."""
        self.stop_event.set()
        self._wakeup.set()
        stream = self._stream
        if stream is not None:
            stream.close()

    def retry(self) -> None:
        """End a back-off at once (any thread); nothing when none is under way but the next
        one, which then retries at once."""
        self._wakeup.set()

    def stop(self) -> None:
        self.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2)

    def _run(self) -> None:
        delay = self.initial_delay
        while not self.stop_event.is_set():
            try:
                if not self.rv:
                    self._list()
                self._watch()
                delay = self.initial_delay
            except _Expired:
                self.rv = ""  # relist at once
            except (ApiError, ApiUnreachable) as exc:
                if self.stop_event.is_set():  # stop() cut the watch
                    return
                if isinstance(exc, ApiError) and exc.status == 410:
                    self.rv = ""
                    continue
                self.sink.failed(str(exc))
                self._wakeup.wait(delay)
                self._wakeup.clear()
                delay = min(delay * 2, self.max_delay)

    def _list(self) -> None:
        answer = self.conn.request("GET", self.path, query=dict(self.query))
        self.lists += 1
        items = [i for i in answer.get("items") or [] if isinstance(i, dict)]
        rv = ApiMeta.of(answer).resource_version
        for item in items:  # list items carry no kind
            item.setdefault("kind", str(answer.get("kind", "")).removesuffix("List"))
            item.setdefault("apiVersion", answer.get("apiVersion", "v1"))
        self.sink.listed(items, rv)
        self.rv = rv

    def _watch(self) -> None:
        timeout = self.watch_timeout * (1 + self.rng())
        query: dict[str, Any] = {**self.query, "resourceVersion": self.rv,
                                 "allowWatchBookmarks": "true",
                                 "timeoutSeconds": str(int(timeout))}
        stream = self.conn.watch(self.path, query, read_timeout=timeout + 30)
        self._stream = stream
        if self.stop_event.is_set():  # cancelled while it was being opened
            self._stream = None
            stream.close()
            return
        self.watches += 1
        try:
            for event in stream:
                if self.stop_event.is_set():
                    return
                kind = str(event.get("type", ""))
                obj = event.get("object")
                if not isinstance(obj, dict):
                    continue
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired()
                    raise ApiError(int(obj.get("code") or 500), str(obj.get("reason", "")),
                                   str(obj.get("message", "")))
                rv = ApiMeta.of(obj).resource_version
                self.sink.event(kind, obj)  # BOOKMARK too: it only moves the version on
                if rv:
                    self.rv = rv
        finally:
            self._stream = None
            stream.close()


class _Expired(Exception):
    pass
