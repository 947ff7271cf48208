"""The file source's pure read: a static pod path (a directory or one file) -> ``SourceSet``.

Rules (kubelet ``config/file.go``): names starting with '.' are ignored; subdirectories are
not entered; one Pod per file, in file-name order; a file over 10 MiB is rejected without
being read past 10 MiB + 1 byte; a bad file is reported and never hides the others; a missing
path or an empty directory is an empty set. An unreadable directory raises
``SourceReadError`` (the caller then changes nothing rather than dropping every pod).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from podvisor.services.pod import (
    MAX_MANIFEST_BYTES,
    FieldIssue,
    ParsedPod,
    PodValidationError,
    decode_pod,
)
from podvisor.services.sources.common import (
    Seen,
    SourceError,
    SourceSet,
    build_static_pod,
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
    With a ``cache``, files whose stat did not change are not parsed again."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return SourceSet(SOURCE)
    except OSError as exc:
        raise SourceReadError(exc.errno, f"cannot stat {path}: {exc.strerror}") from exc
    if not stat.S_ISDIR(info.st_mode):
        return within_budget(_read_files([path], node_name, seen, tick, [], cache))
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError as exc:
        raise SourceReadError(exc.errno, f"cannot list {path}: {exc.strerror}") from exc
    files: list[Path] = []
    notes: list[str] = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if _is_dir(entry):
            notes.append(f"{entry.path}: a directory; not recursing")
        else:
            files.append(Path(entry.path))
    return within_budget(_read_files(files, node_name, seen, tick, notes, cache))


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=True)
    except OSError:
        return False


def _read_files(files: list[Path], node_name: str, seen: Seen, tick: Callable[[], None],
                notes: list[str], cache: ParseCache | None) -> SourceSet:
    pods = []
    errors: list[SourceError] = []
    for file in files:
        tick()
        where = str(file)
        try:
            outcome = _decode_file(file, where, cache)
            if isinstance(outcome, PodValidationError):
                errors.extend(errors_of(outcome))
                continue
            pods.append(build_static_pod(outcome, node_name=node_name, source=SOURCE,
                                         location=where, seen=seen))
        except PodValidationError as exc:
            errors.extend(errors_of(exc))
        except _NotRegular:
            notes.append(f"{where}: not a regular file; ignored")
        except OSError as exc:
            errors.append(SourceError(where, "", f"cannot read: {exc.strerror or exc}"))
    if cache is not None:
        cache.keep_only(str(f) for f in files)
    return SourceSet(SOURCE, tuple(pods), tuple(errors), tuple(notes))


Outcome = ParsedPod | PodValidationError


def _decode_file(file: Path, where: str, cache: ParseCache | None) -> Outcome:
    info = os.stat(file)
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    if cache is not None and (hit := cache.get(where, key)) is not None:
        return hit
    outcome: Outcome
    try:
        outcome = decode_pod(read_capped(file, MAX_MANIFEST_BYTES), where)
    except PodValidationError as exc:
        outcome = exc
    if cache is not None:
        cache.put(where, key, outcome)
    return outcome


class ParseCache:
    """Decoded manifests by file name, reused while the file's stat (device, inode, size,
    mtime and ctime in ns) is unchanged: a relist then costs a stat per file, not a parse
    (parsing a large YAML file takes seconds). One thread."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[tuple[int, ...], Outcome]] = {}
        self.hits = 0

    def get(self, where: str, key: tuple[int, ...]) -> Outcome | None:
        entry = self._entries.get(where)
        if entry is None or entry[0] != key:
            return None
        self.hits += 1
        return entry[1]

    def put(self, where: str, key: tuple[int, ...], outcome: Outcome) -> None:
        self._entries[where] = (key, outcome)

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
