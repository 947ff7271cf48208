"""``cri`` faults in the embedded runtime's gRPC servicer (issue 28): latency, a gRPC status
code, or a hang, on chosen runtime.v1 methods (all of them when a fault names none).

``CriFaults`` holds the faults in force (set from the runtime's loop, ``ServiceLoop.on_faults``;
read by the gRPC threads: a lock guards the swap); ``FaultInterceptor`` wraps every method's
handler and asks it, per call, before the servicer runs: ``latency`` waits ``delay`` seconds
then answers as usual, ``error`` answers the fault's status code (``UNAVAILABLE`` by default) and
never reaches the engine, ``hang`` waits until the fault is cleared or expires (or the server
stops) and then answers as usual. A hang on ``Version`` (or on every method) silences the
runtime's own probe (``liveness.py``; its calls are spared latency and errors, not hangs), so
the supervisor kills it as hung and starts another, which reads the fault again until it ends:
that is how a hung runtime is detected and replaced.
The runtime's containers are untouched by all three (their monitors do not call the servicer).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from podvisor.ipc.faults import ActiveFault, FaultSpec
from podvisor.services.runtime.liveness import PROBE_METADATA

__all__ = ["CriFaults", "FaultInterceptor"]


class CriFaults:
    """Thread-safe."""

    def __init__(self, rand: Callable[[], float] = random.random) -> None:
        self._lock = threading.Lock()
        self._rules: tuple[tuple[str, FaultSpec], ...] = ()
        self._changed = threading.Condition(self._lock)
        self._closed = False
        self._rand = rand

    def set(self, faults: Sequence[ActiveFault]) -> None:
        with self._lock:
            self._rules = tuple((f.id, f.spec) for f in faults if f.spec.kind == "cri")
            self._changed.notify_all()

    def close(self) -> None:
        """The server stops: every hang ends."""
        with self._lock:
            self._closed = True
            self._changed.notify_all()

    def rule_for(self, method: str) -> tuple[str, FaultSpec] | None:
        with self._lock:
            rules = self._rules
        for fid, spec in rules:
            if spec.methods and method not in spec.methods:
                continue
            if spec.rate < 1 and self._rand() >= spec.rate:
                continue
            return fid, spec
        return None

    def hang(self, fid: str) -> None:
        """Block until fault ``fid`` is no longer in force (or the server stops)."""
        with self._lock:
            self._changed.wait_for(
                lambda: self._closed or all(f != fid for f, _ in self._rules))


def _apply(faults: CriFaults, method: str, context: grpc.ServicerContext,
           probe: bool) -> None:
    found = faults.rule_for(method)
    if found is None:
        return
    fid, spec = found
    if probe and spec.action != "hang":
        return
    if spec.action == "latency":
        threading.Event().wait(spec.delay)
    elif spec.action == "hang":
        faults.hang(fid)
    elif spec.action == "error":
        context.abort(grpc.StatusCode[spec.code],
                      f"injected fault {fid}: {spec.code} on {method}")


class FaultInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, faults: CriFaults) -> None:
        self._faults = faults

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = str(handler_call_details.method).rsplit("/", 1)[-1]
        probe = PROBE_METADATA in tuple(handler_call_details.invocation_metadata or ())
        faults = self._faults
        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
                _apply(faults, method, context, probe)
                return inner_uu(request, context)
            return handler._replace(unary_unary=unary_unary)
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            def unary_stream(request: Any, context: grpc.ServicerContext) -> Any:
                _apply(faults, method, context, probe)
                yield from inner_us(request, context)
            return handler._replace(unary_stream=unary_stream)
        return handler
