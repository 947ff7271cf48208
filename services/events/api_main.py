"""Process ``events-api``: every event recorded on the bus (``events.event.recorded``) goes to
the API server as a core/v1 Event, aggregated and rate-limited (``apisink.py``). Runs when
``kubeconfig`` is set. The main thread runs the service loop (receives, heartbeats); a helper
thread sends, so a slow API server never stalls the bus. Up to ``QUEUE`` events wait while the
server is away (oldest dropped first, counted); they are sent in order once it is back.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import asdict
from typing import Any

from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop
from podvisor.ipc.messages import Event
from podvisor.services.apiserver import ApiConnection, ApiError, ApiMeta, ApiUnreachable
from podvisor.services.events.apisink import ApiEventSink

QUEUE = 1000
INITIAL_DELAY = 0.8


def run(ctx: ChildContext) -> None:
    config = ctx.config
    if not config.kubeconfig:
        ctx.log.info("events.api.disabled", reason="kubeconfig is not set")
        return
    pending: deque[tuple[dict[str, Any], float]] = deque(maxlen=QUEUE)
    cond = threading.Condition()
    stop = threading.Event()
    failure: list[BaseException] = []
    loop = ServiceLoop(ctx)

    def receive() -> None:
        env = subscriber.recv(0)
        while env is not None:
            if isinstance(env.message, Event):
                with cond:
                    pending.append((asdict(env.message), ctx.clock.wall()))
                    cond.notify()
            env = subscriber.recv(0)

    # subscribed before the connection is made: that imports the kubernetes client (~0.5 s,
    # longer on a busy machine), and the first events of the agent's start (a pod's Started)
    # published meanwhile would reach no subscriber
    subscriber = loop.subscriber([Event.TOPIC], receive)
    conn = ApiConnection(config.kubeconfig)
    loop.closing(conn)
    sink = ApiEventSink(conn, config.node_name)

    def helper() -> None:
        try:
            _send_loop(ctx, sink, pending, cond, stop)
        except BaseException as exc:  # re-raised by the main thread
            failure.append(exc)

    thread = threading.Thread(target=helper, name="events-api", daemon=True)
    thread.start()

    def step(now: float) -> float | None:
        if failure:
            raise failure[0]
        return None

    try:
        loop.run(step)
    finally:
        stop.set()
        with cond:
            cond.notify()
        thread.join(2)
        loop.close()


def _send_loop(ctx: ChildContext, sink: ApiEventSink,
               pending: deque[tuple[dict[str, Any], float]], cond: threading.Condition,
               stop: threading.Event) -> None:
    delay = INITIAL_DELAY
    while not stop.is_set():
        with cond:
            if not pending:
                cond.wait(1.0)
                continue
            event, at = pending[0]
        if not sink.node_uid:
            try:
                node = sink.conn.request("GET", f"/api/v1/nodes/{sink.node}")
                sink.node_uid = ApiMeta.of(node).uid
            except (ApiError, ApiUnreachable):
                pass  # node events go without the UID until the Node exists
        try:
            sink.send(event, at)
        except ApiUnreachable as exc:
            ctx.log.debug("events.api.unreachable", reason=str(exc), pending=len(pending))
            stop.wait(delay)
            delay = min(delay * 2, ctx.config.api_retry_max_delay)
            continue
        delay = INITIAL_DELAY
        with cond:
            if pending and pending[0][0] is event:
                pending.popleft()
