"""Process ``source-file``: publish the static pods under ``staticPodPath`` (see publish.py).

Stateless: every change and every relist (``fileCheckFrequency``) publishes the FULL set.
Invalid manifests are logged (``source.pod.invalid`` with file, field and reason) when first
seen or changed, and travel in ``PodSet.errors`` every time.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

from podvisor.services.events.publisher import EventPublisher
from podvisor.services.events.recorder import Recorder
from podvisor.services.sources.common import SourceSet
from podvisor.services.sources.file_source import FileSource
from podvisor.services.sources.files import SourceReadError
from podvisor.services.sources.publish import SetPublisher
from podvisor.services.sources.report import Reporter
from podvisor.services.sources.watcher import new_inotify_watcher
from podvisor.services.sources.worker import LoopWorker, Progress
from podvisor.supervisor.child import ChildContext

POLL = 0.25  # seconds between heartbeats at most


class _Publish(Protocol):
    def __call__(self, result: SourceSet | None) -> None: ...


def run(ctx: ChildContext) -> None:
    config = ctx.config
    publisher = SetPublisher(ctx, "file")
    events = Recorder(ctx.name)
    event_pub = EventPublisher(ctx.zctx, ctx.paths, ctx.name)
    reporter = Reporter(ctx.log, key="file", events=events)

    def publish(result: SourceSet | None) -> None:
        """Publish ``result`` (when there is one) and answer pending snapshot requests."""
        if result is not None:
            reporter.report(result)
            publisher.publish(result)
        events.flush(event_pub)
        publisher.service()

    try:
        if not config.static_pod_path:
            ctx.log.info("source.disabled", reason="staticPodPath is not set")
            _idle(ctx, publish, config.file_check_frequency)
            return
        path = Path(config.static_pod_path)
        ctx.log.info("source.started", path=str(path), period=config.file_check_frequency)
        progress = Progress()
        source = FileSource(path, config.node_name, config.file_check_frequency,
                            new_inotify_watcher(path), tick=progress.tick)
        try:
            _loop(ctx, source, progress, publish)
        finally:
            source.close()
    finally:
        publisher.close()
        event_pub.close()


def _loop(ctx: ChildContext, source: FileSource, progress: Progress,
          publish: _Publish) -> None:
    """Reads run on a helper thread (a big manifest parses for seconds); this thread
    heartbeats and publishes."""

    def step() -> SourceSet | None:
        try:
            return source.poll(POLL)
        except SourceReadError as exc:
            ctx.log.error("source.read_failed", path=str(source.path), reason=str(exc))
            return None

    worker = LoopWorker(step, ctx.stop, progress, name="source-file-read")
    worker.start()
    while not ctx.stop.is_set():
        ctx.heartbeat()
        publish(worker.next(POLL))
    worker.join(2 * POLL)


def _idle(ctx: ChildContext, publish: _Publish, period: float) -> None:
    """No path configured: an empty set now and every period (the source counts as seen)."""
    due = 0.0
    while not ctx.stop.is_set():
        now = time.monotonic()
        publish(SourceSet("file") if now >= due else None)
        due = now + period if now >= due else due
        ctx.heartbeat()
        ctx.stop.wait(POLL)
