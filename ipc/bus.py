"""The bus: PUB/SUB over a supervisor-run XSUB/XPUB forwarder, on ``ipc://`` sockets.

Publishers connect PUB sockets to ``paths.bus_pub``; subscribers connect SUB sockets to
``paths.bus_sub``; the supervisor runs ``BusProxy`` between them. Thread-safety: like every zmq
socket, a ``Publisher`` or ``Subscriber`` belongs to one thread.

Blind spot: ZeroMQ PUB drops silently when a queue reaches its high-water mark, and a message sent
before subscriptions propagate (a slow joiner) is lost. State that must not be lost therefore
travels through ``podvisor.ipc.clone``, whose sequence numbers and snapshots recover from both.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Sequence

import zmq

from podvisor.ipc.busgate import BusGate
from podvisor.ipc.clock import SYSTEM_CLOCK, Clock
from podvisor.ipc.codec import DEFAULT_MAX_BYTES, Codec, DecodeError, Envelope
from podvisor.ipc.messages import Message
from podvisor.ipc.paths import RunPaths

HWM = 100_000


class Publisher:
    """Publishes declared messages with a per-publisher sequence number. Never blocks."""

    def __init__(
        self, zctx: zmq.Context[zmq.Socket[bytes]], paths: RunPaths, source: str,
        codec: Codec | None = None, *, clock: Clock = SYSTEM_CLOCK, gate: BusGate | None = None,
    ) -> None:
        """``gate``: the process's bus faults (``ipc/busgate.py``), consulted per message."""
        self.source = source
        self._clock = clock
        self._gate = gate
        self.codec = codec or Codec()
        self.seq = 0
        self.dropped = 0
        self.socket = zctx.socket(zmq.PUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, HWM)
        self.socket.connect(paths.bus_pub)

    def publish(self, msg: Message, topic: str | None = None) -> bool:
        """Send ``msg``; False means it was dropped (and counted), never that we waited."""
        self.seq += 1
        [frame] = self.codec.encode(msg, self.source, self.seq, self._clock.monotonic(),
                                     topic)
        if self._gate is not None and self._gate.active:
            verdict = self._gate.verdict("send", topic or msg.TOPIC)
            for _ in range(verdict.copies):
                if verdict.delay:
                    self._gate.hold(verdict.delay, lambda: self._send(frame))
                elif not self._send(frame):
                    return False
            return True
        return self._send(frame)

    def _send(self, frame: bytes) -> bool:
        try:
            self.socket.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1
            return False
        return True

    def close(self) -> None:
        self.socket.close(linger=0)


class Subscriber:
    """Receives declared messages on topic prefixes; drops and counts anything malformed."""

    def __init__(
        self, zctx: zmq.Context[zmq.Socket[bytes]], paths: RunPaths, topics: Sequence[str],
        codec: Codec | None = None, *, clock: Clock = SYSTEM_CLOCK, gate: BusGate | None = None,
    ) -> None:
        """``gate``: the process's bus faults (``ipc/busgate.py``), consulted per message."""
        self._clock = clock
        self._gate = gate
        self._held: deque[tuple[float, Envelope]] = deque()  # delayed or duplicated by the gate
        self.codec = codec or Codec()
        self.drops: Counter[str] = Counter()
        self.received = 0
        self.socket = zctx.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, HWM)
        for topic in topics:
            self.socket.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.socket.connect(paths.bus_sub)

    def recv(self, timeout: float | None = 0.0) -> Envelope | None:
        """The next valid envelope, or None when none arrives within ``timeout`` seconds
        (0 = only what is already queued; None = wait forever)."""
        deadline = None if timeout is None else self._clock.monotonic() + timeout
        while True:
            if self._held and self._held[0][0] <= self._clock.monotonic():
                return self._take_held()
            try:
                frame = self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                wait_ms = None
                if deadline is not None:
                    wait_ms = max(0, int((deadline - self._clock.monotonic()) * 1000))
                if self._held:
                    wait = max(0, int((self._held[0][0] - self._clock.monotonic()) * 1000) + 1)
                    wait_ms = wait if wait_ms is None else min(wait_ms, wait)
                if not self.socket.poll(wait_ms):
                    if self._held and self._held[0][0] <= self._clock.monotonic():
                        continue
                    return None
                continue
            try:
                env = self.codec.decode((frame,))
            except DecodeError as e:
                self.drops[e.reason] += 1
                continue
            if self._gate is not None and self._gate.active:
                verdict = self._gate.verdict("recv", env.topic)
                if verdict.copies != 1 or verdict.delay:
                    due = self._clock.monotonic() + verdict.delay
                    if self._held:
                        due = max(due, self._held[-1][0])
                    self._held.extend((due, env) for _ in range(verdict.copies))
                    self._gate.recv_due(id(self), self._held[0][0] if self._held else None)
                    continue
            if self._held:  # in order: behind what is held
                self._held.append((self._held[-1][0], env))
                continue
            self.received += 1
            return env

    def _take_held(self) -> Envelope:
        _, env = self._held.popleft()
        if self._gate is not None:
            self._gate.recv_due(id(self), self._held[0][0] if self._held else None)
        self.received += 1
        return env

    @property
    def holding(self) -> bool:
        """Messages a bus fault holds back are due now (the loop hands them over even though
        the socket is not readable)."""
        return bool(self._held) and self._held[0][0] <= self._clock.monotonic()

    def close(self) -> None:
        self.socket.close(linger=0)


class BusProxy:
    """The XSUB/XPUB forwarder, on its own thread (libzmq's C proxy; the GIL is released)."""

    def __init__(self, zctx: zmq.Context[zmq.Socket[bytes]], paths: RunPaths) -> None:
        self._zctx = zctx
        self._paths = paths
        self._thread: threading.Thread | None = None
        self._ctl_addr = f"inproc://bus-proxy-{id(self)}"
        self._ctl: zmq.Socket[bytes] | None = None
        self._ready = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bus-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("bus proxy did not start")

    def _run(self) -> None:
        xsub = self._zctx.socket(zmq.XSUB)
        xpub = self._zctx.socket(zmq.XPUB)
        ctl = self._zctx.socket(zmq.PAIR)
        for s in (xsub, xpub, ctl):
            s.setsockopt(zmq.LINGER, 0)
        xsub.setsockopt(zmq.RCVHWM, HWM)
        xpub.setsockopt(zmq.SNDHWM, HWM)
        xsub.bind(self._paths.bus_pub)
        xpub.bind(self._paths.bus_sub)
        ctl.bind(self._ctl_addr)
        self._ready.set()
        try:
            zmq.proxy_steerable(xsub, xpub, None, ctl)
        except zmq.ContextTerminated:
            pass
        finally:
            for s in (xsub, xpub, ctl):
                s.close(linger=0)

    def stop(self) -> None:
        if self._thread is None:
            return
        ctl = self._zctx.socket(zmq.PAIR)
        ctl.setsockopt(zmq.LINGER, 0)
        ctl.connect(self._ctl_addr)
        ctl.send(b"TERMINATE")
        self._thread.join(5)
        ctl.close(linger=0)
        self._thread = None


__all__ = ["DEFAULT_MAX_BYTES", "BusProxy", "Envelope", "Publisher", "Subscriber"]
