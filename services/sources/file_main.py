"""Process ``source-file``: publish the static pods under ``staticPodPath`` (see publish.py).

Stateless: every change and every relist (``fileCheckFrequency``) publishes the FULL set.
Invalid manifests are logged (``source.pod.invalid`` with file, field and reason) when first
seen or changed, and travel in ``PodSetValue.errors`` every time.

Reads run on the service loop's worker (a big manifest parses for seconds); the loop's thread
heartbeats, publishes (zmq sockets stay on it) and sends events. A read that makes no progress
for ``STALL_LIMIT`` is a hang: the process exits and the supervisor restarts it.
"""

from __future__ import annotations

from pathlib import Path

from podvisor.common.child import ChildContext
from podvisor.common.service import ServiceLoop, Worker
from podvisor.services.events import EventPublisher, Recorder
from podvisor.services.sources.common import SourceSet
from podvisor.services.sources.file_source import FileSource
from podvisor.services.sources.files import SourceReadError
from podvisor.services.sources.publish import SetPublisher
from podvisor.services.sources.report import Reporter
from podvisor.services.sources.watcher import new_inotify_watcher

# The read step blocks on inotify until a change or the next relist, at most this long (well
# within the worker's stall limit).
READ_WAIT = 30.0
STALL_LIMIT = 120.0


class FileSourceService:
    """The source-file process: built once from the context, run by ``run()``. Without
    ``staticPodPath`` it publishes an empty set now and every ``fileCheckFrequency`` (the
    source counts as seen)."""

    def __init__(self, ctx: ChildContext) -> None:
        config = ctx.config
        self.ctx = ctx
        self.loop = ServiceLoop(ctx)
        self.publisher = SetPublisher(ctx, "file", self.loop)
        self.events = Recorder(ctx.name, ctx.clock.wall)
        self.event_pub = EventPublisher(ctx.zctx, ctx.paths, ctx.name, clock=ctx.clock)
        self.loop.closing(self.event_pub)
        self.loop.watch(self.event_pub.socket)  # held events go out once someone subscribes
        self.reporter = Reporter(ctx.log, key="file", events=self.events)
        self._period = config.file_check_frequency
        self._due = 0.0
        self.source: FileSource | None = None
        self.reader: Worker[SourceSet] | None = None
        if config.static_pod_path:
            path = Path(config.static_pod_path)
            self.reader = self.loop.worker(self._read, stall=STALL_LIMIT,
                                           name="source-file-read", deliver=self._publish)
            self.source = FileSource(path, config.node_name, config.file_check_frequency,
                                     new_inotify_watcher(path), tick=self.reader.tick,
                                     clock=ctx.clock.monotonic, wall=ctx.clock.wall)
            self.loop.closing(self.source)  # after the reader has stopped

    def run(self) -> None:
        if self.source is None:
            self.ctx.log.info("source.disabled", reason="staticPodPath is not set")
        else:
            self.ctx.log.info("source.started", path=str(self.source.path),
                              period=self._period)
        self.loop.run(self.step)

    def step(self, now: float) -> float | None:
        if self.source is None and now >= self._due:
            self._publish(SourceSet("file"))
            self._due = now + self._period
        self.events.flush(self.event_pub)
        return self._due if self.source is None else None

    def _read(self, now: float) -> float:
        """The reader's step (worker thread): one wait for a change or the relist, then a read
        when one is due; at once again."""
        assert self.source is not None and self.reader is not None
        try:
            result = self.source.poll(READ_WAIT)
        except SourceReadError as exc:
            self.ctx.log.error("source.read_failed", path=str(self.source.path), reason=str(exc))
            result = None
        if result is not None:
            self.reader.put(result)
        return now

    def _publish(self, result: SourceSet) -> None:
        """Publish ``result`` and send held events (loop thread)."""
        self.reporter.report(result)
        self.publisher.publish(result)
        self.events.flush(self.event_pub)

    def close(self) -> None:
        self.loop.close()


def run(ctx: ChildContext) -> None:
    service = FileSourceService(ctx)
    try:
        service.run()
    finally:
        service.close()
