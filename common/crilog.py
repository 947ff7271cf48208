"""Reading a container's CRI log file across log rotation: one implementation for
``podvisorctl logs`` and the main port's ``/containerLogs``, and the naming the rotation in
``imagegc`` writes. A rotated file is ``<log>.<YYYYmmdd-HHMMSS>`` (``.gz`` once compressed);
they sort oldest first by name, and the live ``<log>`` comes last."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

__all__ = ["MAX_READ", "read_tail", "rotated_files", "with_rotated"]

MAX_READ = 64 << 20  # bytes read from the end of one file at most


def rotated_files(log: Path) -> list[Path]:
    """The rotated siblings of ``log`` (``<log>.<stamp>`` and ``<log>.<stamp>.gz``), oldest
    first (a ``.tmp`` of a compression under way is not one)."""
    try:
        found = [p for p in log.parent.iterdir()
                 if p.name.startswith(log.name + ".") and not p.name.endswith(".tmp")]
    except OSError:
        return []
    return sorted(found, key=lambda p: p.name.removesuffix(".gz"))


def with_rotated(log: Path) -> list[Path]:
    """``log``'s rotated files oldest first, then ``log`` itself."""
    return [*rotated_files(log), log]


def read_tail(path: Path, max_read: int = MAX_READ) -> tuple[bytes, int]:
    """The last ``max_read`` bytes of ``path`` (decompressed when it ends in ``.gz``) and the
    offset just past them in the file as stored (the live file's size read, for following it
    on). Raises ``OSError``/``EOFError`` when it cannot be read."""
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as packed:
            data = packed.read()
        return data[-max_read:], path.stat().st_size
    with path.open("rb") as src:
        start = max(0, os.fstat(src.fileno()).st_size - max_read)
        src.seek(start)
        data = src.read(max_read)
    return data, start + len(data)
