"""The file source's pure read: a static pod path (a directory or one file) -> ``SourceSet``.

Rules (kubelet ``config/file.go``): names starting with '.' are ignored; subdirectories are
not entered; one Pod per file, in file-name order; a file over 10 MiB is rejected without
being read past 10 MiB + 1 byte; a bad file is reported and never hides the others; a missing
path or an empty directory is an empty set. An unreadable directory raises
``SourceReadError`` (the caller then changes nothing rather than dropping every pod).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.services.pod import (
    MAX_MANIFEST_BYTES,
    FieldIssue,
    ParsedPod,
    PodValidationError,
    decode_pod,
)
from podvisor.services.sources.common import (
    BuiltPod,
    Seen,
    SourceError,
    SourceSet,
    build_static,
    errors_of,
    within_budget,
)

SOURCE = "file"


class SourceReadError(OSError):
    """The static pod path itself could not be listed (not a per-file problem)."""


def read_static_pods(path: Path, node_name: str, seen: Seen,
                     tick: Callable[[], None] = lambda: None,
                     cache: ParseCache | None = None) -> SourceSet:
    """Read every manifest under ``path``; ``tick`` is called between files (progress).
    With a ``cache``, files whose stat did not change are neither read nor parsed again, and
    their pods are not rebuilt."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return SourceSet(SOURCE)
    except OSError as exc:
        raise SourceReadError(exc.errno, f"cannot stat {path}: {exc.strerror}") from exc
    if not stat.S_ISDIR(info.st_mode):
        return _read_files([str(path)], node_name, seen, tick, [], cache)
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError as exc:
        raise SourceReadError(exc.errno, f"cannot list {path}: {exc.strerror}") from exc
    files: list[str] = []
    notes: list[str] = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if _is_dir(entry):
            notes.append(f"{entry.path}: a directory; not recursing")
        else:
            files.append(entry.path)
    return _read_files(files, node_name, seen, tick, notes, cache)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=True)
    except OSError:
        return False


def _read_files(files: list[str], node_name: str, seen: Seen, tick: Callable[[], None],
                notes: list[str], cache: ParseCache | None) -> SourceSet:
    built: list[BuiltPod] = []
    errors: list[SourceError] = []
    for where in files:
        tick()
        try:
            entry = _decode_file(where, cache)
            outcome = entry.outcome
            if isinstance(outcome, PodValidationError):
                errors.extend(errors_of(outcome))
                continue
            pod = entry.built
            # the first-seen time is the one part not from the file: rebuild if it moved
            if pod is None or seen(pod.pod.uid) != pod.seen:
                pod = entry.built = build_static(outcome, node_name=node_name, source=SOURCE,
                                                 location=where, seen=seen)
            built.append(pod)
        except PodValidationError as exc:
            errors.extend(errors_of(exc))
        except _NotRegular:
            notes.append(f"{where}: not a regular file; ignored")
        except OSError as exc:
            errors.append(SourceError(where, "", f"cannot read: {exc.strerror or exc}"))
    if cache is not None:
        cache.keep_only(files)
    result = SourceSet(SOURCE, tuple(b.pod for b in built), tuple(errors), tuple(notes),
                       tuple(b.wire for b in built))
    return within_budget(result, [b.size for b in built])


Outcome = ParsedPod | PodValidationError


@dataclass
class _Entry:
    key: tuple[int, ...]
    outcome: Outcome
    digest: bytes = b""  # of the bytes ``outcome`` was parsed from (b"": not read)
    built: BuiltPod | None = None  # the static pod made from ``outcome`` (a ParsedPod)


def _decode_file(where: str, cache: ParseCache | None) -> _Entry:
    info = os.stat(where)
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    if cache is not None and (hit := cache.get(where, key)) is not None:
        return hit
    outcome: Outcome
    digest = b""
    try:
        data = read_capped(Path(where), MAX_MANIFEST_BYTES)
        digest = hashlib.blake2b(data, digest_size=16).digest()
        old = cache.same_bytes(where, digest) if cache is not None else None
        if old is not None:  # read again (changed recently) but the same bytes: same pod
            old.key = key
            return old
        outcome = decode_pod(data, where)
    except PodValidationError as exc:
        outcome = exc
    entry = _Entry(key, outcome, digest)
    if cache is not None:
        cache.put(where, entry)
    return entry


# A file whose mtime or ctime is this recent is read again even when its stat matches: two
# writes of the same size within one timestamp tick (a jiffy on many filesystems) leave the
# stat unchanged; once the file is older, a later write must move its timestamps.
RECENT_NS = 2_000_000_000


class ParseCache:
    """Decoded manifests (and the pods built from them) by file name, reused while the file's
    stat (device, inode, size, mtime and ctime in ns) is unchanged and the file was not changed
    within ``recent_ns`` of now (wall clock, as file times): a relist then costs a stat per
    file, not a read, a parse and a rebuild (parsing a large YAML file takes seconds). One
    thread."""

    def __init__(self, wall_ns: Callable[[], int] = SYSTEM_CLOCK.wall_ns,
                 recent_ns: int = RECENT_NS) -> None:
        self._entries: dict[str, _Entry] = {}
        self._wall_ns = wall_ns
        self._recent_ns = recent_ns
        self.hits = 0  # reused from the stat alone
        self.rereads = 0  # read again, same bytes: not parsed again

    def get(self, where: str, key: tuple[int, ...]) -> _Entry | None:
        entry = self._entries.get(where)
        if entry is None or entry.key != key:
            return None
        if max(key[3], key[4]) > self._wall_ns() - self._recent_ns:
            return None  # changed just now: a same-size rewrite in the same tick looks equal
        self.hits += 1
        return entry

    def same_bytes(self, where: str, digest: bytes) -> _Entry | None:
        """The entry of ``where`` if it was parsed from bytes with this digest: a file read
        again because it changed recently (200 manifests dropped at once are all recent for
        a while) is then not parsed again when its bytes did not change."""
        entry = self._entries.get(where)
        if entry is None or not entry.digest or entry.digest != digest:
            return None
        self.rereads += 1
        return entry

    def put(self, where: str, entry: _Entry) -> None:
        self._entries[where] = entry

    def keep_only(self, wheres: Iterable[str]) -> None:
        keep = set(wheres)
        self._entries = {w: e for w, e in self._entries.items() if w in keep}


class _NotRegular(Exception):
    pass


def read_capped(file: Path, cap: int) -> bytes:
    """The file's bytes if it is a regular file of at most ``cap`` bytes. The size is checked
    before reading and at most ``cap + 1`` bytes are read (the file may grow meanwhile).
    Raises ``PodValidationError`` when too big, ``OSError`` when unreadable."""
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _NotRegular()
        if info.st_size > cap:
            raise _too_big(file, cap, info.st_size)
        chunks: list[bytes] = []
        remaining = cap + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > cap:
            raise _too_big(file, cap, len(data))
        return data
    finally:
        os.close(fd)


def _too_big(file: Path, cap: int, size: int) -> PodValidationError:
    return PodValidationError(str(file), [FieldIssue(
        "", f"file is larger than {cap // (1024 * 1024)} MiB ({size} bytes); not read")])
