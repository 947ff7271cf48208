"""Process ``source-http``: GET ``staticPodURL`` every ``httpCheckFrequency`` and publish the
FULL set of its pods as a ``PodSetValue`` (see ``HttpSource`` for what each answer changes).

The GET runs on the service loop's worker, so the loop keeps heartbeating and answering
snapshot requests through a slow server; a GET still running after ``STALL_LIMIT`` is a hang
(the process exits and the supervisor restarts it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import requests

from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop, Worker
from podvisor.services import events as ev
from podvisor.services.events import EventPublisher, Recorder
from podvisor.services.sources.common import SourceSet
from podvisor.services.sources.http_source import HttpSource
from podvisor.services.sources.httpfetch import fetch, flatten_headers
from podvisor.services.sources.publish import SetPublisher
from podvisor.services.sources.report import Reporter

STALL_LIMIT = 120.0


@dataclass(frozen=True)
class _Fetched:
    """One GET's outcome, from the fetcher to the loop's thread."""

    result: SourceSet | None
    error: str


class HttpSourceService:
    """The source-http process: built once from the context, run by ``run()``. Without
    ``staticPodURL`` it publishes an empty set now and every ``httpCheckFrequency``."""

    def __init__(self, ctx: ChildContext) -> None:
        config = ctx.config
        self.ctx = ctx
        self.url = config.static_pod_url
        self.loop = ServiceLoop(ctx)
        self.publisher = SetPublisher(ctx, "http", self.loop)
        self.events = Recorder(ctx.name, ctx.clock.wall)
        self.event_pub = EventPublisher(ctx.zctx, ctx.paths, ctx.name, clock=ctx.clock)
        self.loop.closing(self.event_pub)
        self.loop.watch(self.event_pub.socket)  # held events go out once someone subscribes
        self.reporter = Reporter(ctx.log, key="url", events=self.events)
        self._period = config.http_check_frequency
        self._due = 0.0
        self._last_error = ""
        self.source: HttpSource | None = None
        self.fetcher: Worker[_Fetched] | None = None
        if self.url:
            session = requests.Session()
            self.loop.closing(session)
            self.source = HttpSource(self.url, config.node_name, config.http_check_frequency,
                                     partial(fetch, session, self.url,
                                             flatten_headers(config.static_pod_url_header)),
                                     clock=ctx.clock.monotonic, wall=ctx.clock.wall)
            self.fetcher = self.loop.worker(self._fetch, stall=STALL_LIMIT,
                                            name="source-http-fetch", deliver=self._fetched)

    def run(self) -> None:
        if self.source is None:
            self.ctx.log.info("source.disabled", reason="staticPodURL is not set")
        else:
            self.ctx.log.info("source.started", url=self.url, period=self._period)
        self.loop.run(self.step)

    def step(self, now: float) -> float | None:
        if self.source is None:
            if now >= self._due:
                self.publisher.publish(SourceSet("http"))
                self._due = now + self._period
            return self._due
        self.events.flush(self.event_pub)
        return None

    def _fetch(self, now: float) -> float:
        """The fetcher's step (worker thread): a GET when one is due."""
        assert self.source is not None and self.fetcher is not None
        wait = self.source.due_in()
        if wait > 0:
            return now + wait
        result = self.source.refresh()
        self.fetcher.put(_Fetched(result, self.source.last_error))
        return self.ctx.clock.monotonic()  # the next step looks at the next GET's time

    def _fetched(self, got: _Fetched) -> None:
        """Log a new failure, publish the set (loop thread)."""
        if got.error and got.error != self._last_error:
            self.ctx.log.warning("source.fetch_failed", url=self.url, reason=got.error)
            self.events.record(ev.WARNING, ev.FAILED_FETCH, f"{self.url}: {got.error}",
                               ev.manifest_object("url", self.url))
        self._last_error = got.error
        if got.result is not None:
            self.reporter.report(got.result)
            self.publisher.publish(got.result)
        self.events.flush(self.event_pub)

    def close(self) -> None:
        self.loop.close()


def run(ctx: ChildContext) -> None:
    service = HttpSourceService(ctx)
    try:
        service.run()
    finally:
        service.close()
