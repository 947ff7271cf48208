"""common/crilog.py: reading CRI log entries."""

from __future__ import annotations

from podvisor.common.crilog import parse_line


def test_parse_line_reads_stream_text_and_whether_full() -> None:
    assert parse_line(b"2026-01-01T00:00:00.1Z stdout F hi there") == ("stdout", b"hi there", True)
    assert parse_line(b"2026-01-01T00:00:00.1Z stderr P part") == ("stderr", b"part", False)
    assert parse_line(b"2026-01-01T00:00:00.1Z stdout F") == ("stdout", b"", True)
    assert parse_line(b"not a cri line") is None
