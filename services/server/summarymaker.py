"""One ``/stats/summary`` answer from its parts, in one call on a worker thread.

The parts: the runtime's CRI ``ListContainerStats`` and ``ImageFsInfo``, the node's CPU and
memory (``NodeSampler``), the running containers' log folders (``LogUsage.of``), the ``pleg``
replica's start times, and the JSON text. The main port used to hand each blocking part to the
executor in turn (four thread hops per scrape) and to assemble and encode the answer on the
event loop; ``SummaryMaker`` does it all in one executor job.

Kept between scrapes, for what cannot have changed: each container's pod and name (by
container ID, ``container_refs``; a container's labels never change, and the memo holds the
previous answer's containers only), the start times (per ``pleg`` mapping: a published
``View``'s maps are never mutated, so the same object means the same records), the log
folders' frozen bytes (``LogUsage``) and the node's previous CPU sample (its rate).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError
from podvisor.services.server.logusage import LogUsage
from podvisor.services.server.summary import (
    ContainerRef,
    NodeSampler,
    container_refs,
    image_fs_stats,
    start_times,
    summary,
)

__all__ = ["SummaryMaker"]


class SummaryMaker:
    """Thread-safe (the memos are swapped under a lock; the runtime is asked outside it)."""

    def __init__(self, node_name: str, boot_ns: int, root_dir: str, pod_logs: str,
                 container_stats: Callable[[], list[pb.ContainerStats]],
                 image_fs_info: Callable[[], pb.ImageFsInfoResponse] | None,
                 wall: Callable[[], float]) -> None:
        """``container_stats`` raises ``CriError`` when the runtime does not answer (so does
        ``make``); ``image_fs_info``'s ``CriError`` leaves ``imageFs`` out."""
        self._node_name = node_name
        self._boot_ns = boot_ns
        self._root_dir = root_dir
        self._pod_logs = pod_logs
        self._container_stats = container_stats
        self._image_fs_info = image_fs_info
        self._wall = wall
        self._sampler = NodeSampler()
        self._logs = LogUsage()
        self._lock = threading.Lock()
        self._refs: dict[str, ContainerRef | None] = {}
        self._pleg: Mapping[str, Any] | None = None
        self._starts: tuple[dict[str, int], dict[str, int]] = ({}, {})

    def make(self, pleg: Mapping[str, Any], volumes: Mapping[str, Any] | None = None,
             ) -> tuple[dict[str, Any], str | None]:
        """(the Summary, why ``imageFs`` is left out or None). ``volumes``: the volume
        manager's map (each pod's ``volume`` entries)."""
        stats = self._container_stats()
        now_ns = int(self._wall() * 1e9)
        node = self._sampler.sample(now_ns, self._root_dir)
        image_fs, why = None, None
        if self._image_fs_info is not None:
            try:
                image_fs = image_fs_stats(self._image_fs_info())
            except CriError as exc:  # the summary still answers, without imageFs
                why = str(exc)
        with self._lock:
            refs = container_refs(stats, self._refs)
            if pleg is not self._pleg:
                self._pleg, self._starts = pleg, start_times(pleg)
            starts = self._starts
        logs = self._logs.of(self._pod_logs, (
            (r.namespace, r.pod, r.uid, r.name) for r in refs if r is not None))
        body = summary(self._node_name, self._boot_ns, node, stats, pleg, logs, image_fs,
                       now_ns, refs, starts, volumes)
        return body, why

    def make_json(self, pleg: Mapping[str, Any], volumes: Mapping[str, Any] | None = None,
                  ) -> tuple[bytes, str | None]:
        """``make``'s Summary as compact JSON text (UTF-8)."""
        body, why = self.make(pleg, volumes)
        return json.dumps(body, separators=(",", ":")).encode(), why
