"""Pure parts of the embedded runtime: CRI log records, exit codes, config helpers."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from cri_api.v1 import api_pb2 as pb

from podvisor.services.runtime.engine import _log_path, _stop_signal
from podvisor.services.runtime.model import labels_match
from podvisor.services.runtime.monitor import MAX_LINE, _LogWriter, exit_code_of, rfc3339nano

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z"


def _records(path: Path) -> list[tuple[str, str, str]]:
    out = []
    for line in path.read_bytes().decode().splitlines():
        m = re.fullmatch(rf"({STAMP}) (stdout|stderr) ([FP]) (.*)", line)
        assert m, line
        out.append((m.group(2), m.group(3), m.group(4)))
    return out


def test_rfc3339nano() -> None:
    assert rfc3339nano(1_000_000_000 * 86400 + 5) == b"1970-01-02T00:00:00.000000005Z"


def test_log_writer_full_partial_and_final_lines(tmp_path: Path) -> None:
    path = tmp_path / "c.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    writer = _LogWriter(fd, str(path))
    writer.feed(b"stdout", b"one\ntw")
    writer.feed(b"stderr", b"err\n")
    writer.feed(b"stdout", b"o\n" + b"x" * (MAX_LINE + 10) + b"\n")
    writer.feed(b"stdout", b"tail", final=True)
    os.close(writer.fd)
    assert _records(path) == [
        ("stdout", "F", "one"), ("stderr", "F", "err"), ("stdout", "F", "two"),
        ("stdout", "P", "x" * MAX_LINE), ("stdout", "F", "x" * 10), ("stdout", "F", "tail"),
    ]


def test_log_writer_reopen_creates_a_new_file(tmp_path: Path) -> None:
    path = tmp_path / "c.log"
    writer = _LogWriter(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), str(path))
    writer.feed(b"stdout", b"before\n")
    os.rename(path, tmp_path / "c.log.1")
    writer.reopen()
    writer.feed(b"stdout", b"after\n")
    os.close(writer.fd)
    assert [r[2] for r in _records(path)] == ["after"]
    assert [r[2] for r in _records(tmp_path / "c.log.1")] == ["before"]


def test_exit_codes_map_signals_to_128_plus() -> None:
    assert exit_code_of(0) == 0
    assert exit_code_of(3 << 8) == 3
    assert exit_code_of(signal.SIGKILL) == 137
    assert exit_code_of(signal.SIGTERM) == 143


def test_log_path_joins_directory_and_relative_path() -> None:
    assert _log_path("/logs/pod", "c/0.log") == "/logs/pod/c/0.log"
    assert _log_path("", "c/0.log") == ""
    assert _log_path("/logs/pod", "") == ""
    assert _log_path("", "/abs/c.log") == "/abs/c.log"


def test_stop_signal_defaults_to_term() -> None:
    assert _stop_signal(pb.RUNTIME_DEFAULT) == signal.SIGTERM
    assert _stop_signal(pb.SIGINT) == signal.SIGINT


def test_labels_match_is_exact_subset() -> None:
    assert labels_match({"a": "1", "b": "2"}, {"a": "1"})
    assert not labels_match({"a": "1"}, {"a": "2"})
    assert labels_match({}, {})
