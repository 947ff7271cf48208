"""The charts' routes and their live samples on the ops port.

- ``GET /api/usage``: the whole history (``UsageStore.history``: ``fine`` for the last 10
  minutes at full resolution, ``coarse`` for the hour, ``marks``, ``pressure``), once per page
  load; then
- every ``interval`` the sampler's sample goes to every open page as a ``usage`` event of the
  dashboard's feed (``Dashboard.push``; encoded once, the same bytes for every page; it is the
  pages' keep-alive too). With no page open the samples are only stored.

The sampling runs on the web thread's timers (``WebService.later``, cancelled at stop) and a
worker thread (the sample blocks on the CRI call); one sample at a time.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import Executor
from typing import Any

from aiohttp import web

from podvisor.common.logs import Log
from podvisor.common.web import WebService
from podvisor.services.ops.dashboard import Dashboard
from podvisor.services.ops.feed import frame
from podvisor.services.ops.sampler import Sampler

__all__ = ["ChartFeed", "add_charts"]


class ChartFeed:
    def __init__(self, sampler: Sampler, dash: Dashboard, executor: Executor,
                 interval: float, log: Log) -> None:
        self.log = log
        self.sampler, self.dash, self.executor, self.interval = sampler, dash, executor, interval
        self.samples = 0
        self.failures = 0

    def start(self, web_: WebService[Any]) -> None:
        """The first sample now, then one every ``interval`` (web thread)."""
        self._web = web_
        web_.later(0.0, self._tick)

    def _tick(self) -> None:
        asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            sample = await loop.run_in_executor(self.executor, self.sampler.sample)
            data = self.sampler.take_frame(sample)
        except RuntimeError:  # the executor is shut down: the process stops
            return
        except Exception as err:  # one failed sample: the next one comes all the same
            self.failures += 1
            self.log.warning("ops.charts.sample_failed", error=repr(err))
        else:
            self.samples += 1
            if self.dash.clients:
                self.dash.push(frame("usage", json.dumps(data, separators=(",", ":"))))
        if not self._web.stopping():
            self._web.later(max(0.0, started + self.interval - loop.time()), self._tick)

    async def usage(self, request: web.Request) -> web.Response:
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(
            self.executor, lambda: json.dumps(self.sampler.history(), separators=(",", ":")))
        return web.Response(text=body, content_type="application/json")


def add_charts(app: web.Application, sampler: Sampler, dash: Dashboard, executor: Executor,
               interval: float, log: Log) -> ChartFeed:
    feed = ChartFeed(sampler, dash, executor, interval, log)
    app.router.add_get("/api/usage", feed.usage)
    return feed
