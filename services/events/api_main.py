"""Process ``events-api``: every event recorded on the bus (``events.event.recorded``) goes to
the API server as a core/v1 Event, aggregated and rate-limited (``apisink.py``). Runs when
``kubeconfig`` is set. The service loop's thread receives and heartbeats; its worker sends, so a
slow API server never stalls the bus. Up to ``QUEUE`` events wait while the
server is away (oldest dropped first, counted); they are sent in order once it is back.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import asdict
from typing import Any

from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop, Worker
from podvisor.ipc.messages import Event
from podvisor.services.apiserver import ApiConnection, ApiError, ApiMeta, ApiUnreachable
from podvisor.services.events.apisink import ApiEventSink

QUEUE = 1000
INITIAL_DELAY = 0.8


class EventsApiService:
    """The events-api process, built once: the loop's thread receives events into ``pending``,
    the loop's worker sends them (``step``)."""

    def __init__(self, ctx: ChildContext) -> None:
        self.ctx = ctx
        self.pending: deque[tuple[dict[str, Any], float]] = deque(maxlen=QUEUE)
        self.lock = threading.Lock()  # a receive that drops the oldest vs. its sent pop
        self.delay = INITIAL_DELAY
        self.retry_at = -math.inf  # backing off: nothing sent before this, new events or not
        self.loop = ServiceLoop(ctx)
        # subscribed before the connection is made: that imports the kubernetes client (~0.5 s,
        # longer on a busy machine), and the first events of the agent's start (a pod's Started)
        # published meanwhile would reach no subscriber
        self.subscriber = self.loop.subscriber([Event.TOPIC], self.receive)
        conn = ApiConnection(ctx.config.kubeconfig)
        self.loop.closing(conn)
        self.loop.on_faults(conn.faults.set)  # injected api faults (issue 28)
        self.sink = ApiEventSink(conn, ctx.config.node_name)
        self.sender: Worker[None] = self.loop.worker(self.step, stall=None, name="events-api")

    def run(self) -> None:
        self.loop.run(lambda now: None)  # the work is the worker's

    def receive(self) -> None:
        """Queue what arrived (loop thread; the oldest drop once ``QUEUE`` wait)."""
        env = self.subscriber.recv(0)
        while env is not None:
            if isinstance(env.message, Event):
                with self.lock:
                    self.pending.append((asdict(env.message), self.ctx.clock.wall()))
                self.sender.wake()
            env = self.subscriber.recv(0)

    def step(self, now: float) -> float | None:
        """Send the oldest pending event (worker thread); again at once while more wait, after
        a back-off while the server is unreachable, when woken once none is left."""
        if now < self.retry_at:
            return self.retry_at
        with self.lock:
            if not self.pending:
                return None
            event, at = self.pending[0]
        sink = self.sink
        if not sink.node_uid:
            try:
                node = sink.conn.request("GET", f"/api/v1/nodes/{sink.node}")
                sink.node_uid = ApiMeta.of(node).uid
            except (ApiError, ApiUnreachable):
                pass  # node events go without the UID until the Node exists
        try:
            sink.send(event, at)
        except ApiUnreachable as exc:
            self.ctx.log.debug("events.api.unreachable", reason=str(exc),
                               pending=len(self.pending))
            wait, self.delay = self.delay, min(self.delay * 2, self.ctx.config.api_retry_max_delay)
            self.retry_at = self.ctx.clock.monotonic() + wait
            return self.retry_at
        self.delay = INITIAL_DELAY
        with self.lock:
            if self.pending and self.pending[0][0] is event:  # not dropped meanwhile
                self.pending.popleft()
        return now

    def close(self) -> None:
        self.loop.close()


def run(ctx: ChildContext) -> None:
    if not ctx.config.kubeconfig:
        ctx.log.info("events.api.disabled", reason="kubeconfig is not set")
        return
    service = EventsApiService(ctx)
    try:
        service.run()
    finally:
        service.close()
