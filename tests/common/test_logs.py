"""JSON-lines logging: one line per event on the stream and in the rotated file."""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from podvisor.common.logs import setup_logging


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    """setup_logging replaces the root logger's handlers: put the test runner's back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line]


def test_events_fields_tracebacks_and_foreign_records(tmp_path: Path) -> None:
    stream = io.StringIO()
    log = setup_logging("t", tmp_path, "debug", 10_000, 2, stream=stream)
    try:
        raise ZeroDivisionError("x")
    except ZeroDivisionError:
        log.exception("op.failed", a=1)
    log.bind(pod="p").info("pod.seen", b=2)
    logging.getLogger("third").warning("hello %s", "w")
    out = lines(stream.getvalue())
    assert [e["event"] for e in out] == ["op.failed", "pod.seen", "hello w"]
    assert out[0]["level"] == "error" and out[0]["a"] == 1
    assert "ZeroDivisionError" in str(out[0]["exc"])
    assert out[1]["pod"] == "p" and out[1]["b"] == 2 and out[1]["subsystem"] == "t"
    assert out[2]["logger"] == "third"
    assert lines((tmp_path / "t.log").read_text()) == out  # the same lines in the file


def test_file_rotates_at_max_size_keeping_backups(tmp_path: Path) -> None:
    (tmp_path / "t.log").write_text("x" * 150 + "\n")  # an existing file counts from its size
    log = setup_logging("t", tmp_path, "info", 300, 2, stream=io.StringIO())
    for i in range(20):
        log.info("fill", i=i)
    names = sorted(os.listdir(tmp_path))
    assert names == ["t.log", "t.log.1", "t.log.2"]
    assert all(os.path.getsize(tmp_path / n) < 300 for n in names)
    last = lines((tmp_path / "t.log").read_text())
    assert last[-1]["i"] == 19
