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


def run(ctx: ChildContext) -> None:
    config = ctx.config
    if not config.kubeconfig:
        ctx.log.info("source.disabled", reason="kubeconfig is not set")
        return
    loop = ServiceLoop(ctx)
    publisher = SetPublisher(ctx, "api", loop)
    mirrors = loop.owner(loop.publisher(), API_MIRRORS)
    wake = WakePipe()
    loop.closing(wake)
    state = ApiPodState(wake.wake)
    conn = ApiConnection(config.kubeconfig)
    loop.closing(conn)
    selector = f"spec.nodeName={config.node_name}"
    reflector = Reflector(conn, "/api/v1/pods", {"fieldSelector": selector},
                          state, watch_timeout=config.api_watch_timeout,
                          max_delay=config.api_retry_max_delay)
    store = ResumeStore(ctx.paths.state_dir / FILE_NAME, ctx.log, server=conn.host,
                        selector=selector)
    resume = store.load()
    if resume is not None:
        state.resumed(resume.items, resume.rv)
        reflector.rv = resume.rv
        ctx.log.info("source.api.resumed", version=resume.rv, pods=len(resume.items))
    saved = state.snapshot()[0]
    next_save = 0.0

    def save(now: float) -> None:
        nonlocal saved, next_save
        changes, rv, items = state.snapshot()
        if changes == saved or not rv:
            return
        try:
            store.save(rv, items)
        except OSError as err:
            ctx.log.error("source.api.resume_save_failed", path=str(store.path), error=str(err))
        else:
            saved = changes
        next_save = now + SAVE_INTERVAL

    events = Recorder(ctx.name, ctx.clock.wall)
    event_pub = EventPublisher(ctx.zctx, ctx.paths, ctx.name, clock=ctx.clock)
    loop.closing(event_pub)
    loop.watch(event_pub.socket)
    loop.watch(wake.read_fd, wake.drain)
    reporter = Reporter(ctx.log, key="url", events=events)
    builder = SetBuilder()
    ctx.log.info("source.started", server=conn.host, node=config.node_name)
    reflector.start()
    last_error = ""

    def step(now: float) -> float | None:
        nonlocal last_error
        if now >= next_save:
            save(now)
        raw = state.take()
        if raw is not None:
            result = builder.build(raw)
            reporter.report(result.pods)
            publisher.publish(result.pods)
            mirrors.set(MIRRORS_KEY, MirrorSet(result.mirrors))
            ctx.log.debug("source.api.set", pods=len(result.pods.pods),
                          mirrors=len(result.mirrors), version=reflector.rv)
        if state.last_error != last_error:
            last_error = state.last_error
            if last_error:
                ctx.log.warning("source.api.failed", server=conn.host, reason=last_error)
                events.record(ev.WARNING, ev.FAILED_FETCH, f"{conn.host}: {last_error}",
                              ev.manifest_object("url", conn.host))
            else:
                ctx.log.info("source.api.recovered", server=conn.host)
        events.flush(event_pub)
        return next_save if state.snapshot()[0] != saved else None

    try:
        loop.run(step)
    finally:
        reflector.stop()
        save(ctx.clock.monotonic())
        loop.close()
