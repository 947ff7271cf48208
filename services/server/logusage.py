"""The bytes and files of containers' log folders, for ``/stats/summary``'s ``logs``.

A container's folder is ``<pod_logs>/<namespace>_<name>_<uid>/<container>/``: every restart's
``<n>.log`` and their rotated files (gzipped included). ``LogUsage`` remembers, per container
folder whose mtime did not change (no file added, removed or renamed), the bytes of every file
but the live one (``<n>.log`` of the highest n: rotated files and earlier instances' logs no
longer change). Asked for the running containers (``of``), a scrape costs two ``stat`` calls
per container (its folder, its live file), and nothing for the folders of pods not running;
asked for every folder (``all``), a listing of ``pod_logs`` and a ``stat`` per pod folder more.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

__all__ = ["LogUsage", "log_usage"]

# container folder -> (mtime ns, live file name or "", other files' bytes, files)
_Entry = tuple[int, str, int, int]


class LogUsage:
    """Thread-safe; its memory holds the folders of the previous call only."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, tuple[int, list[str]]] = {}
        self._containers: dict[str, _Entry] = {}

    def of(self, pod_logs: str, wanted: Iterable[tuple[str, str, str, str]]
           ) -> dict[tuple[str, str], tuple[int, int]]:
        """(pod UID, container name) -> (bytes, files) for each wanted (namespace, pod name,
        pod UID, container name) whose folder exists."""
        with self._lock:
            cache = self._containers
        seen: dict[str, _Entry] = {}
        out: dict[tuple[str, str], tuple[int, int]] = {}
        for namespace, name, uid, container in wanted:
            path = f"{pod_logs}/{namespace}_{name}_{uid}/{container}"
            got = self._container(path, cache, seen)
            if got is not None:
                out[(uid, container)] = got
        with self._lock:
            self._containers = seen
        return out

    def all(self, pod_logs: str) -> dict[tuple[str, str], tuple[int, int]]:
        """(pod UID, container name) -> (bytes, files) of every container folder."""
        out: dict[tuple[str, str], tuple[int, int]] = {}
        try:
            pod_dirs = list(os.scandir(pod_logs))
        except OSError:
            return out
        with self._lock:
            pods, containers = dict(self._pods), dict(self._containers)
        seen_pods: dict[str, tuple[int, list[str]]] = {}
        seen: dict[str, _Entry] = {}
        for pod_dir in pod_dirs:
            parts = pod_dir.name.split("_", 2)
            if len(parts) != 3:
                continue
            try:
                if not pod_dir.is_dir():
                    continue
                mtime = pod_dir.stat().st_mtime_ns
                cached = pods.get(pod_dir.path)
                names = cached[1] if cached is not None and cached[0] == mtime else [
                    c.name for c in os.scandir(pod_dir.path) if c.is_dir()]
            except OSError:
                continue  # removed meanwhile (container GC)
            seen_pods[pod_dir.path] = (mtime, names)
            for name in names:
                got = self._container(f"{pod_dir.path}/{name}", containers, seen)
                if got is not None:
                    out[(parts[2], name)] = got
        with self._lock:
            self._pods, self._containers = seen_pods, seen
        return out

    @staticmethod
    def _scan(path: str, mtime: int) -> _Entry:
        live, live_count, frozen, files = "", -1, 0, 0
        sizes: dict[str, int] = {}
        for f in os.scandir(path):
            if f.is_file():
                sizes[f.name] = f.stat().st_size
                stem = f.name.removesuffix(".log")
                if stem != f.name and stem.isdigit() and int(stem) > live_count:
                    live, live_count = f.name, int(stem)
        for name, size in sizes.items():
            if name != live:
                frozen += size
            files += 1
        return mtime, live, frozen, files

    def _container(self, path: str, cache: dict[str, _Entry],
                   seen: dict[str, _Entry]) -> tuple[int, int] | None:
        try:
            mtime = os.stat(path).st_mtime_ns
            cached = cache.get(path)
            entry = cached if cached is not None and cached[0] == mtime else self._scan(path,
                                                                                        mtime)
            try:
                live = os.stat(f"{path}/{entry[1]}").st_size if entry[1] else 0
            except FileNotFoundError:  # rotated since: list the folder again
                entry = self._scan(path, mtime)
                live = os.stat(f"{path}/{entry[1]}").st_size if entry[1] else 0
        except OSError:
            return None  # no folder (yet), removed meanwhile (container GC), or rotated twice
        seen[path] = entry
        return entry[2] + live, entry[3]


def log_usage(pod_logs: str, usage: LogUsage | None = None
              ) -> dict[tuple[str, str], tuple[int, int]]:
    """(pod UID, container name) -> (bytes, files) of every container folder under
    ``pod_logs`` (``usage``, when given, remembers what cannot have changed between calls)."""
    return (usage or LogUsage()).all(pod_logs)
