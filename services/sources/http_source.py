"""The HTTP source's loop state: when to GET again, and what a GET's answer changes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.services.pod import PodValidationError
from podvisor.services.sources.common import FirstSeen, SourceSet, errors_of
from podvisor.services.sources.file_source import EARLY_REPUBLISH
from podvisor.services.sources.httpfetch import FetchError, decode_http_body

Clock = Callable[[], float]


class HttpSource:
    """``refresh()`` GETs the URL once and returns the set to publish, or None.

    - 200 with a new body: decoded into a new set (each bad PodList item reported).
    - 200 with the same body as last time: no decoding; the last set again (re-publishing it
      keeps restarted subscribers whole and changes nothing for the others).
    - an error (non-200, timeout, too large, a body that is not a Pod or PodList): nothing
      changes; the last good pods are re-published with the new error, or None before any.
    ``last_error`` holds the latest failure ("" after a success). One thread."""

    def __init__(self, url: str, node_name: str, period: float, fetcher: Callable[[], bytes],
                 *, clock: Clock = SYSTEM_CLOCK.monotonic, wall: Clock = SYSTEM_CLOCK.wall) -> None:
        self._url = url
        self._node = node_name
        self._period = period
        self._fetcher = fetcher
        self._clock = clock
        self._seen = FirstSeen(wall)
        self._next = clock()
        self._body: bytes | None = None
        self._last: SourceSet | None = None
        self.last_error = ""
        self.fetches = 0

    def due_in(self) -> float:
        """Seconds until the next GET is due (<= 0: now)."""
        return self._next - self._clock()

    def refresh(self) -> SourceSet | None:
        first_good = self._last is None
        self.fetches += 1
        try:
            body = self._fetcher()
            if body != self._body or self._last is None:
                self._last = self._decode(body)
                self._body = body
            self.last_error = ""
        except FetchError as exc:
            self.last_error = str(exc)
        except PodValidationError as exc:
            self.last_error = str(exc).replace("\n", "; ")
            self._body = None
            if self._last is not None:
                self._last = replace(self._last, errors=tuple(errors_of(exc)))
        early = first_good and self._last is not None
        self._next = self._clock() + (min(EARLY_REPUBLISH, self._period) if early
                                      else self._period)
        return self._last

    def _decode(self, body: bytes) -> SourceSet:
        result = decode_http_body(body, self._url, self._node, self._seen)
        self._seen.forget_except(p.uid for p in result.pods)
        return result
