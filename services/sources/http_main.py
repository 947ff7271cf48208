"""Process ``source-http``: GET ``staticPodURL`` every ``httpCheckFrequency`` and publish the
FULL set of its pods as a ``PodSetValue`` (see ``HttpSource`` for what each answer changes).

The GET runs on a helper thread so the main loop keeps heartbeating through a slow server.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import requests

from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop
from podvisor.services import events as ev
from podvisor.services.events import EventPublisher, Recorder
from podvisor.services.sources.common import SourceSet
from podvisor.services.sources.http_source import HttpSource
from podvisor.services.sources.httpfetch import fetch, flatten_headers
from podvisor.services.sources.publish import SetPublisher
from podvisor.services.sources.report import Reporter
from podvisor.services.sources.worker import run_in_thread

POLL = 0.25  # heartbeat and snapshot answers while a GET runs on its thread


@dataclass(frozen=True)
class _Events:
    recorder: Recorder
    sink: EventPublisher


def run(ctx: ChildContext) -> None:
    config = ctx.config
    loop = ServiceLoop(ctx)
    publisher = SetPublisher(ctx, "http", loop)
    try:
        if not config.static_pod_url:
            ctx.log.info("source.disabled", reason="staticPodURL is not set")
            due = 0.0

            def idle(now: float) -> float:
                nonlocal due
                if now >= due:
                    publisher.publish(SourceSet("http"))
                    due = ctx.clock.monotonic() + config.http_check_frequency
                return due

            loop.run(idle)
            return
        with requests.Session() as session:
            fetcher = partial(fetch, session, config.static_pod_url,
                              flatten_headers(config.static_pod_url_header))
            source = HttpSource(config.static_pod_url, config.node_name,
                                config.http_check_frequency, fetcher,
                                clock=ctx.clock.monotonic, wall=ctx.clock.wall)
            ctx.log.info("source.started", url=config.static_pod_url,
                         period=config.http_check_frequency)
            events = Recorder(ctx.name, ctx.clock.wall)
            event_pub = EventPublisher(ctx.zctx, ctx.paths, ctx.name, clock=ctx.clock)
            loop.closing(event_pub)
            loop.watch(event_pub.socket)  # held events go out once someone subscribes
            _loop(ctx, loop, source, publisher, Reporter(ctx.log, key="url", events=events),
                  _Events(events, event_pub))
    finally:
        loop.close()


def _loop(ctx: ChildContext, loop: ServiceLoop, source: HttpSource, publisher: SetPublisher,
          reporter: Reporter, events: _Events) -> None:
    last_error = ""
    finished = False

    def beat() -> None:  # while a fetch runs on its thread
        ctx.heartbeat()
        publisher.service()

    def step(now: float) -> float | None:
        nonlocal last_error, finished
        events.recorder.flush(events.sink)
        wait = source.due_in()
        if wait > 0:
            return now + wait
        done, result = run_in_thread(source.refresh, beat, ctx.stop, POLL)
        if not done:
            finished = True
            return None
        if source.last_error and source.last_error != last_error:
            ctx.log.warning("source.fetch_failed", url=ctx.config.static_pod_url,
                            reason=source.last_error)
            events.recorder.record(ev.WARNING, ev.FAILED_FETCH,
                          f"{ctx.config.static_pod_url}: {source.last_error}",
                          ev.manifest_object("url", ctx.config.static_pod_url))
        last_error = source.last_error
        if result is not None:
            reporter.report(result)
            publisher.publish(result)
        events.recorder.flush(events.sink)
        return ctx.clock.monotonic()  # the next turn looks at the next fetch's time

    loop.run(step, done=lambda: finished or ctx.stop.is_set())
