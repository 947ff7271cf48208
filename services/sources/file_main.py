"""Process ``source-file``: publish the static pods under ``staticPodPath`` (see publish.py).

Stateless: every change and every relist (``fileCheckFrequency``) publishes the FULL set.
Invalid manifests are logged (``source.pod.invalid`` with file, field and reason) when first
seen or changed, and travel in ``PodSetValue.errors`` every time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop
from podvisor.services.events import EventPublisher, Recorder
from podvisor.services.sources.common import SourceSet
from podvisor.services.sources.file_source import FileSource
from podvisor.services.sources.files import SourceReadError
from podvisor.services.sources.publish import SetPublisher
from podvisor.services.sources.report import Reporter
from podvisor.services.sources.watcher import new_inotify_watcher
from podvisor.services.sources.worker import LoopWorker, Progress

# The read thread blocks on inotify until a change or the next relist, at most this long (it
# must tick its progress well within the worker's stall limit).
READ_WAIT = 30.0


class _Publish(Protocol):
    def __call__(self, result: SourceSet | None) -> None: ...


def run(ctx: ChildContext) -> None:
    config = ctx.config
    loop = ServiceLoop(ctx)
    publisher = SetPublisher(ctx, "file", loop)
    events = Recorder(ctx.name, ctx.clock.wall)
    event_pub = EventPublisher(ctx.zctx, ctx.paths, ctx.name, clock=ctx.clock)
    loop.closing(event_pub)
    loop.watch(event_pub.socket)  # held events go out once someone subscribes
    reporter = Reporter(ctx.log, key="file", events=events)

    def publish(result: SourceSet | None) -> None:
        """Publish ``result`` (when there is one) and send held events."""
        if result is not None:
            reporter.report(result)
            publisher.publish(result)
        events.flush(event_pub)

    try:
        if not config.static_pod_path:
            ctx.log.info("source.disabled", reason="staticPodPath is not set")
            _idle(loop, publish, config.file_check_frequency)
            return
        path = Path(config.static_pod_path)
        ctx.log.info("source.started", path=str(path), period=config.file_check_frequency)
        progress = Progress(ctx.clock.monotonic)
        source = FileSource(path, config.node_name, config.file_check_frequency,
                            new_inotify_watcher(path), tick=progress.tick,
                            clock=ctx.clock.monotonic, wall=ctx.clock.wall)
        try:
            _loop(ctx, loop, source, progress, publish)
        finally:
            source.close()
    finally:
        loop.close()


def _loop(ctx: ChildContext, loop: ServiceLoop, source: FileSource, progress: Progress,
          publish: _Publish) -> None:
    """Reads run on a helper thread (a big manifest parses for seconds); this thread
    heartbeats and publishes, blocking on the snapshot socket, the read thread's results, the
    event socket and stop."""

    def read() -> SourceSet | None:
        try:
            return source.poll(READ_WAIT)
        except SourceReadError as exc:
            ctx.log.error("source.read_failed", path=str(source.path), reason=str(exc))
            return None

    worker = LoopWorker(read, ctx.stop, progress, name="source-file-read")
    worker.start()
    loop.watch(worker.wake_fd)

    def step(now: float) -> None:
        results = worker.take()
        for result in results:
            publish(result)
        if not results:
            publish(None)

    try:
        loop.run(step)
    finally:
        worker.join(1.0)


def _idle(loop: ServiceLoop, publish: _Publish, period: float) -> None:
    """No path configured: an empty set now and every period (the source counts as seen)."""
    due = 0.0

    def step(now: float) -> float:
        nonlocal due
        publish(SourceSet("file") if now >= due else None)
        due = now + period if now >= due else due
        return due

    loop.run(step)
