"""Process ``source-api``: this node's pods from the API server (``kubeconfig``), published as
the FULL set of source ``api`` (map ``pods-api``, key ``set``) after every change, like the
file and HTTP sources; the API's mirror pods go to the map ``api-mirrors`` (key ``mirrors``)
and never run.

A reflector thread lists then watches ``/api/v1/pods?fieldSelector=spec.nodeName=<node>``
(see ``podvisor.services.apiserver.Reflector``) and wakes the service loop through a pipe; each
turn coalesces the changes that arrived since the last one into one set and publishes it.
A restart republishes the full set (the merge turns an identical set into no update): the
last resourceVersion and the set it stands for are saved under ``<rootDir>/state`` as the watch
advances (``api_resume``, at most every 5 s, and on a clean stop); a restart republishes that
set at once and watches on from that version, without a full relist; ``410 Gone`` (the version
compacted away) or a missing/unusable file means a relist, as on a first start.
"""

from __future__ import annotations

from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop
from podvisor.ipc.maps import API_MIRRORS, MIRRORS_KEY, MirrorSet
from podvisor.services import events as ev
from podvisor.services.apiserver import ApiConnection, Reflector, WakePipe
from podvisor.services.events import EventPublisher, Recorder
from podvisor.services.sources.api_resume import FILE_NAME, SAVE_INTERVAL, ResumeStore
from podvisor.services.sources.api_source import ApiPodState, SetBuilder
from podvisor.services.sources.publish import SetPublisher
from podvisor.services.sources.report import Reporter


class ApiSourceService:
    """The source-api process, built once from the context: the reflector's thread fills
    ``state`` and wakes the loop; ``step`` publishes what changed and saves the resume point."""

    def __init__(self, ctx: ChildContext) -> None:
        config = ctx.config
        self.ctx = ctx
        self.loop = ServiceLoop(ctx)
        self.publisher = SetPublisher(ctx, "api", self.loop)
        self.mirrors = self.loop.owner(self.loop.publisher(), API_MIRRORS)
        self.wake = WakePipe()
        self.loop.closing(self.wake)
        self.state = ApiPodState(self.wake.wake)
        self.conn = ApiConnection(config.kubeconfig, "source-api")
        self.loop.closing(self.conn)
        self.loop.on_faults(self.conn.faults.set)  # injected api faults (issue 28)
        selector = f"spec.nodeName={config.node_name}"
        self.reflector = Reflector(self.conn, "/api/v1/pods", {"fieldSelector": selector},
                                   self.state, watch_timeout=config.api_watch_timeout,
                                   max_delay=config.api_retry_max_delay)
        self.store = ResumeStore(ctx.paths.state_dir / FILE_NAME, ctx.log, server=self.conn.host,
                                 selector=selector)
        resume = self.store.load()
        if resume is not None:
            self.state.resumed(resume.items, resume.rv)
            self.reflector.rv = resume.rv
            ctx.log.info("source.api.resumed", version=resume.rv, pods=len(resume.items))
        self.saved = self.state.snapshot()[0]
        self.next_save = 0.0
        self.events = Recorder(ctx.name, ctx.clock.wall)
        self.event_pub = EventPublisher(ctx.zctx, ctx.paths, ctx.name, clock=ctx.clock)
        self.loop.closing(self.event_pub)
        self.loop.watch(self.event_pub.socket)
        self.loop.watch(self.wake.read_fd, self.wake.drain)
        self.reporter = Reporter(ctx.log, key="url", events=self.events)
        self.builder = SetBuilder()
        self.last_error = ""

    def run(self) -> None:
        self.ctx.log.info("source.started", server=self.conn.host, node=self.ctx.config.node_name)
        self.reflector.start()
        self.loop.run(self.step)

    def save(self, now: float) -> None:
        changes, rv, items = self.state.snapshot()
        if changes == self.saved or not rv:
            return
        try:
            self.store.save(rv, items)
        except OSError as err:
            self.ctx.log.error("source.api.resume_save_failed", path=str(self.store.path),
                               error=str(err))
        else:
            self.saved = changes
        self.next_save = now + SAVE_INTERVAL

    def step(self, now: float) -> float | None:
        ctx, conn, events = self.ctx, self.conn, self.events
        if now >= self.next_save:
            self.save(now)
        raw = self.state.take()
        if raw is not None:
            result = self.builder.build(raw)
            self.reporter.report(result.pods)
            self.publisher.publish(result.pods)
            self.mirrors.set(MIRRORS_KEY, MirrorSet(result.mirrors))
            ctx.log.debug("source.api.set", pods=len(result.pods.pods),
                          mirrors=len(result.mirrors), version=self.reflector.rv)
        if self.state.last_error != self.last_error:
            self.last_error = self.state.last_error
            if self.last_error:
                ctx.log.warning("source.api.failed", server=conn.host, reason=self.last_error)
                events.record(ev.WARNING, ev.FAILED_FETCH, f"{conn.host}: {self.last_error}",
                              ev.manifest_object("url", conn.host))
            else:
                ctx.log.info("source.api.recovered", server=conn.host)
        events.flush(self.event_pub)
        return self.next_save if self.state.snapshot()[0] != self.saved else None

    def close(self) -> None:
        self.reflector.stop()
        self.save(self.ctx.clock.monotonic())
        self.loop.close()


def run(ctx: ChildContext) -> None:
    if not ctx.config.kubeconfig:
        ctx.log.info("source.disabled", reason="kubeconfig is not set")
        return
    service = ApiSourceService(ctx)
    try:
        service.run()
    finally:
        service.close()
