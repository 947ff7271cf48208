"""Process ``source-http``: GET ``staticPodURL`` every ``httpCheckFrequency`` and publish the
FULL set of its pods as a ``PodSet`` (see ``HttpSource`` for what each answer changes).

The GET runs on a helper thread so the main loop keeps heartbeating through a slow server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import requests

from podvisor.ipc.bus import Publisher
from podvisor.services.sources.common import SourceSet
from podvisor.services.sources.http_source import HttpSource
from podvisor.services.sources.httpfetch import fetch, flatten_headers
from podvisor.services.sources.report import Reporter
from podvisor.supervisor.child import ChildContext

POLL = 0.25
T = TypeVar("T")


def run(ctx: ChildContext) -> None:
    config = ctx.config
    publisher = Publisher(ctx.zctx, ctx.paths, source=ctx.name)
    try:
        if not config.static_pod_url:
            ctx.log.info("source.disabled", reason="staticPodURL is not set")
            while not ctx.stop.is_set():
                publisher.publish(SourceSet("http").to_message(time.monotonic()))
                if ctx.sleep(config.http_check_frequency):
                    return
            return
        with requests.Session() as session:
            fetcher = partial(fetch, session, config.static_pod_url,
                              flatten_headers(config.static_pod_url_header))
            source = HttpSource(config.static_pod_url, config.node_name,
                                config.http_check_frequency, fetcher)
            ctx.log.info("source.started", url=config.static_pod_url,
                         period=config.http_check_frequency)
            _loop(ctx, source, publisher, Reporter(ctx.log, key="url"))
    finally:
        publisher.close()


def _loop(ctx: ChildContext, source: HttpSource, publisher: Publisher,
          reporter: Reporter) -> None:
    last_error = ""
    while not ctx.stop.is_set():
        ctx.heartbeat()
        wait = source.due_in()
        if wait > 0:
            ctx.stop.wait(min(POLL, wait))
            continue
        done, result = _in_thread(ctx, source.refresh)
        if not done:
            return
        if source.last_error and source.last_error != last_error:
            ctx.log.warning("source.fetch_failed", url=ctx.config.static_pod_url,
                            reason=source.last_error)
        last_error = source.last_error
        if result is not None:
            reporter.report(result)
            publisher.publish(result.to_message(time.monotonic()))


def _in_thread(ctx: ChildContext, fn: Callable[[], T]) -> tuple[bool, T | None]:
    """Run ``fn`` on a daemon thread, heartbeating meanwhile. (False, None) if stopped first;
    an exception in ``fn`` is re-raised here (a crash the supervisor restarts)."""
    box: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            box.append(fn())
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=target, name="source-http-fetch", daemon=True)
    thread.start()
    while thread.is_alive():
        ctx.heartbeat()
        thread.join(POLL)
        if ctx.stop.is_set() and thread.is_alive():
            return False, None
    if error:
        raise error[0]
    return True, box[0]
