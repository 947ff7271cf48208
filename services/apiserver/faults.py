"""``api`` faults in the API connection (issue 28): what stands between a node and its API
server when the server is slow, failing or cutting watches, applied by ``ApiConnection`` to
every request it sends, in the process the fault is aimed at (``ipc/faults.py``).

- ``latency``: each request waits ``delay`` seconds before it goes out;
- ``error``: each request gets ``status`` (429 or a 5xx) instead of an answer
  (``ApiError``, as from the server, reason ``TooManyRequests`` / ``ServiceUnavailable`` /
  ...); nothing reaches the server;
- ``disconnect``: watches open when it starts are cut (their socket shut down: the reader
  sees the stream end, as when a load balancer drops it), and each watch opened while it lasts
  is cut at once (``ApiUnreachable``); plain requests pass;
- ``gone``: each watch path, once per fault, gets one ``ERROR`` event with a ``410 Gone``
  Status in place of its events (the resourceVersion is too old: the reflector relists).

``ApiFaults`` is set from the process's loop (``ServiceLoop.on_faults``) and read by the
threads that send (a lock guards the swap and the open watches).
"""

from __future__ import annotations

import json
import random
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from podvisor.ipc.faults import ActiveFault, FaultSpec

__all__ = ["GONE_EVENT", "ApiFaults", "GoneResponse"]

REASONS = {429: "TooManyRequests", 500: "InternalError", 502: "BadGateway",
           503: "ServiceUnavailable", 504: "Timeout"}
GONE_EVENT = {"type": "ERROR", "object": {
    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
    "message": "too old resource version (injected fault)"}}


class _Closable(Protocol):
    def close(self) -> None: ...


class ApiFaults:
    """Thread-safe."""

    def __init__(self, rand: Callable[[], float] = random.random) -> None:
        self._lock = threading.Lock()
        self._rules: tuple[tuple[str, FaultSpec], ...] = ()
        self._watches: weakref.WeakSet[Any] = weakref.WeakSet()
        self._gone: set[tuple[str, str]] = set()  # (fault id, watch path) answered 410 once
        self._rand = rand
        self._sleep = threading.Event()  # never set: a wait that is not time.sleep
        self.injected = 0

    def set(self, faults: Sequence[ActiveFault]) -> None:
        rules = tuple((f.id, f.spec) for f in faults if f.spec.kind == "api")
        with self._lock:
            new = {fid for fid, _ in rules} - {fid for fid, _ in self._rules}
            self._rules = rules
            cut = [w for w in self._watches] if any(
                spec.action in ("disconnect", "gone") for fid, spec in rules if fid in new) \
                else []
        for watch in cut:  # outside the lock: a close may wait for its reader
            watch.close()

    def _rule(self, actions: tuple[str, ...]) -> tuple[str, FaultSpec] | None:
        with self._lock:
            rules = self._rules
        for fid, spec in rules:
            if spec.action in actions and (spec.rate >= 1 or self._rand() < spec.rate):
                return fid, spec
        return None

    def before(self, method: str, path: str) -> tuple[int, str, str] | None:
        """Before a request goes out: waits out a latency; returns (status, reason, message)
        of an injected error answer, or None to send it."""
        found = self._rule(("latency", "error"))
        if found is None:
            return None
        fid, spec = found
        self.injected += 1
        if spec.action == "latency":
            self._sleep.wait(spec.delay)
            return None
        return (spec.status, REASONS.get(spec.status, "InternalError"),
                f"injected fault {fid}: {spec.status} for {method} {path}")

    def watch_cut(self) -> str | None:
        """A watch about to open is cut at once: why, or None."""
        found = self._rule(("disconnect",))
        if found is None:
            return None
        self.injected += 1
        return f"watch cut (injected fault {found[0]})"

    def gone(self, path: str) -> bool:
        """This watch answers 410 Gone (once per fault and path)."""
        with self._lock:
            rules = self._rules
            for fid, spec in rules:
                if spec.action == "gone" and (fid, path) not in self._gone:
                    self._gone.add((fid, path))
                    self.injected += 1
                    return True
        return False

    def opened(self, watch: _Closable) -> None:
        """A watch that a later ``disconnect`` or ``gone`` fault cuts."""
        with self._lock:
            self._watches.add(watch)


class GoneResponse:
    """Stands in for a watch's HTTP response whose only event is a 410 Gone ERROR."""

    def stream(self, amt: int, decode_content: bool = True) -> Iterator[bytes]:
        yield json.dumps(GONE_EVENT).encode() + b"\n"

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        pass
