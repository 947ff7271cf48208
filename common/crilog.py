"""Reading a container's CRI log file across log rotation: one implementation for
``podvisorctl logs`` and the main port's ``/containerLogs``, and the naming the rotation in
``imagegc`` writes. A rotated file is ``<log>.<YYYYmmdd-HHMMSS>`` (``.gz`` once compressed);
they sort oldest first by name, and the live ``<log>`` comes last."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

__all__ = ["MAX_READ", "parse_line", "read_tail", "rotated_files", "tail_text", "with_rotated"]

MAX_READ = 64 << 20  # bytes read from the end of one file at most


def parse_line(line: bytes) -> tuple[str, bytes, bool] | None:
    """One CRI log entry ``<time> <stdout|stderr> <F|P> <text>`` -> (stream, text, full): a
    full entry (F) ends its line, a partial one (P) continues on the next. None if it is not
    one."""
    parts = line.split(b" ", 3)
    if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr"):
        return None
    return parts[1].decode(), parts[3] if len(parts) == 4 else b"", parts[2] != b"P"


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


def tail_text(path: Path, lines: int, max_bytes: int) -> str:
    """The content of the last ``lines`` entries of a CRI log file (``<time> <stream> <P|F>
    <text>``; a full entry ends its line, a partial one continues on the next), at most the
    last ``max_bytes`` of it, decoded leniently: what the kubelet's
    ``readLastStringFromContainerLogs`` puts in a terminated container's message. Raises
    ``OSError`` when the file cannot be read."""
    data, _ = read_tail(path, max(max_bytes * 4, 64 << 10))
    entries = data.split(b"\n")
    if entries and entries[-1] == b"":
        entries.pop()
    out = bytearray()
    for entry in entries[-lines:]:
        parts = entry.split(b" ", 3)
        if len(parts) < 3:
            continue
        out += parts[3] if len(parts) == 4 else b""
        if parts[2] != b"P":
            out += b"\n"
    return bytes(out[-max_bytes:]).decode(errors="replace")
