"""supervisord's log reading semantics (``options.readFile`` / ``tailFile``), on any file."""

from __future__ import annotations

import os

__all__ = ["BadRead", "read_file", "tail_file", "truncate"]


class BadRead(ValueError):
    """``args[0]`` is the fault name: BAD_ARGUMENTS or FAILED."""


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def read_file(path: str, offset: int, length: int) -> str:
    """``length`` bytes from ``offset``; a negative offset reads that many bytes from the end
    (then ``length`` must be 0); ``length`` 0 reads to the end."""
    try:
        with open(path, "rb") as f:
            if offset < 0:
                if length:
                    raise BadRead("BAD_ARGUMENTS")
                size = f.seek(0, 2)
                f.seek(max(0, size + offset))
                return _text(f.read(-offset))
            if length < 0:
                raise BadRead("BAD_ARGUMENTS")
            f.seek(offset)
            return _text(f.read() if length == 0 else f.read(length))
    except OSError:
        raise BadRead("FAILED") from None


def tail_file(path: str, offset: int, length: int) -> list[object]:
    """``[text, next offset, overflow]``: up to ``length`` bytes from ``offset``; when the file
    grew past ``offset + length`` the read moves to its end and ``overflow`` is set."""
    try:
        with open(path, "rb") as f:
            overflow = False
            size = f.seek(0, 2)
            if size > offset + length:
                overflow = True
                offset = size - 1
            if offset + length > size:
                if offset > size - 1:
                    length = 0
                offset = size - length
            offset, length = max(0, offset), max(0, length)
            data = b""
            if length:
                f.seek(offset)
                data = f.read(length)
            return [_text(data), size, overflow]
    except OSError:
        return ["", offset, False]


def truncate(path: str) -> None:
    """Empty a log file in place (its writer appends, so it goes on at offset 0)."""
    os.truncate(path, 0)
