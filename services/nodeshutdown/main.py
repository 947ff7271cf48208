"""Process ``nodeshutdown``: graceful node shutdown (runs when ``shutdownGracePeriod`` or
``shutdownGracePeriodByPodPriority`` is set), the kubelet's node shutdown manager.

Where logind runs (the system bus has ``org.freedesktop.login1``) it takes a delay inhibitor
lock at start (who ``podvisor``), reads ``InhibitDelayMaxSec`` (the drain ends within it; a
shorter one than the groups' total is logged) and waits for ``PrepareForShutdown(true)``.
Elsewhere (or as well) a ``NodeShutdown`` from the supervisor starts it: ``podvisorctl
shutdown --node``, or SIGTERM/SIGINT of the agent with ``shutdownOnSignal``.

A shutdown: the ``node-shutdown`` map says ``active`` (the node process reports the Node
NotReady, "node is shutting down"); the pods are failed group by group (``drain.py``) with
``FailPod`` (reason ``Terminated``); once the statuses say Failed (at most ``STATUS_WAIT``
more) it releases the lock and publishes ``NodeShutdownDone`` (again every second) and the
supervisor stops the agent.
"""

from __future__ import annotations

from podvisor.common.child import ChildContext
from podvisor.common.config import node_shutdown_groups
from podvisor.common.service import ServiceLoop
from podvisor.ipc.maps import (
    DESIRED,
    NODE_SHUTDOWN,
    NODE_SHUTDOWN_KEY,
    STATUSES,
    DesiredPod,
    NodeShutdownState,
)
from podvisor.ipc.messages import NodeShutdown, NodeShutdownDone
from podvisor.services.nodeshutdown.drain import Drain
from podvisor.services.nodeshutdown.logind import Logind, connect_logind

STATUS_WAIT = 5.0  # after the last group: the statuses' Failed may take this long to show
ANNOUNCE = 1.0  # NodeShutdownDone is published again this often


class NodeShutdownService:
    def __init__(self, ctx: ChildContext, logind: Logind | None) -> None:
        self.ctx, self.clock, self.logind = ctx, ctx.clock, logind
        self.groups = node_shutdown_groups(ctx.config)
        self.loop = ServiceLoop(ctx)
        self.pub = self.loop.publisher()
        self.state = self.loop.owner(self.pub, NODE_SHUTDOWN)
        self.state.set(NODE_SHUTDOWN_KEY, NodeShutdownState())
        self.desired = self.loop.replica(DESIRED)
        self.statuses = self.loop.replica(STATUSES)
        self.sub = self.loop.subscriber([NodeShutdown.TOPIC], self._on_bus)
        self.cap: float | None = None
        self.drain: Drain | None = None
        self.trigger = ""
        self.finished: float | None = None  # when the last group ended
        self.announced = float("-inf")
        if logind is not None:
            self.loop.watch(logind.fileno(), self._on_logind)
            self.loop.closing(logind)
            self._take_lock()

    def _take_lock(self) -> None:
        assert self.logind is not None
        self.cap = self.logind.inhibit_delay_max()
        total = sum(g.seconds for g in self.groups)
        self.logind.inhibit()
        self.ctx.log.info("nodeshutdown.inhibited", who="podvisor", mode="delay",
                          inhibit_delay_max=self.cap, grace_total=total)
        if self.cap < total:
            self.ctx.log.warning("nodeshutdown.inhibit_delay_short", inhibit_delay_max=self.cap,
                                 grace_total=total,
                                 reason="each group's seconds scaled into InhibitDelayMaxSec")

    def _on_bus(self) -> None:
        while (env := self.sub.recv(0)) is not None:
            if isinstance(env.message, NodeShutdown):
                self._begin("request")

    def _on_logind(self) -> None:
        assert self.logind is not None
        if self.logind.prepare_for_shutdown():
            self._begin("logind")

    def _begin(self, trigger: str) -> None:
        if self.drain is not None:
            return
        now = self.clock.monotonic()
        self.trigger = trigger
        self.drain = Drain(self.groups, now, self.cap if trigger == "logind" else None)
        self.state.set(NODE_SHUTDOWN_KEY, NodeShutdownState(True, trigger, self.clock.wall()))
        self.ctx.log.info("nodeshutdown.begin", trigger=trigger,
                          groups=[(g.priority, g.seconds) for g in self.groups])

    def _pods(self) -> dict[str, DesiredPod]:
        return {k: v for k, v in self.desired.items().items() if isinstance(v, DesiredPod)}

    def _statuses_failed(self) -> bool:
        assert self.drain is not None
        statuses = self.statuses.items()
        return all(uid in statuses and statuses[uid].status.phase == "Failed"
                   for uid in self.drain.sent)

    def step(self, now: float) -> float | None:
        drain = self.drain
        if drain is None or not self.desired.synced:
            return None if drain is None else now + 0.5
        group = drain.current
        for request in drain.step(now, self._pods()):
            self.pub.publish(request)
            self.ctx.log.info("nodeshutdown.pod_terminating", pod=request.uid,
                              grace=request.grace, group=drain.current)
        if drain.current != group and not drain.done:
            self.ctx.log.info("nodeshutdown.group", group=drain.current,
                              priority=self.groups[drain.current].priority,
                              seconds=self.groups[drain.current].seconds)
        if not drain.done:
            return drain.next_wake(now)
        if self.finished is None:
            self.finished = now
        if not self._statuses_failed() and now < self.finished + STATUS_WAIT:
            return now + 0.1
        if self.logind is not None and self.logind.lock_fd is not None:
            self.logind.release()
            self.ctx.log.info("nodeshutdown.released")
        if now - self.announced >= ANNOUNCE:
            if self.announced == float("-inf"):
                self.ctx.log.info("nodeshutdown.done", pods=drain.failed, trigger=self.trigger)
            self.announced = now
            self.pub.publish(NodeShutdownDone(pods=drain.failed, trigger=self.trigger,
                                              ts=self.clock.wall()))
        return now + ANNOUNCE


def run(ctx: ChildContext) -> None:
    if not node_shutdown_groups(ctx.config):
        ctx.log.info("nodeshutdown.disabled", reason="shutdownGracePeriod is 0")
        return
    logind = connect_logind()
    if logind is None:
        ctx.log.info("nodeshutdown.no_logind",
                     reason="no org.freedesktop.login1 on the system bus: a graceful node "
                            "shutdown comes from `podvisorctl shutdown --node` or SIGTERM "
                            "with shutdownOnSignal")
    service = NodeShutdownService(ctx, logind)
    try:
        service.loop.run(service.step)
    finally:
        service.loop.close()
