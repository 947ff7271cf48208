"""The /stats/summary scrape path's memory between scrapes: the runtime's process-group scan
(procfs.GroupScanner) and the server's log folder usage (summary.log_usage) give what a fresh
read gives. Real processes and real folders."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from podvisor.services.runtime.procfs import GroupScanner
from podvisor.services.server.summary import log_usage


@pytest.fixture
def groups() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes each in its own process group (as containers are), killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:  # the group each started (its own pid), members and all
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _group(started: list[subprocess.Popen[bytes]], script: str) -> int:
    p = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    started.append(p)
    return p.pid


def _fresh(pgid: int) -> tuple[int, int]:
    """psutil's figures for the group's live members (what the scan used to compute)."""
    cpu = rss = 0
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                t = proc.cpu_times()
                cpu += int((t.user + t.system) * 1e9)
                rss += proc.memory_info().rss
        except (psutil.Error, ProcessLookupError):
            continue
    return cpu, rss


def test_group_scan_matches_psutil_and_finds_new_groups(
        groups: list[subprocess.Popen[bytes]], wait_for: object) -> None:
    a = _group(groups, "sleep 600 & sleep 600 & wait")
    wait_for(lambda: len(psutil.Process(a).children()) == 2, 10.0, 0.02)  # type: ignore[operator]
    scanner = GroupScanner(full_every=3600.0)
    first = scanner.usage({a}, now=0.0)
    cpu, rss = _fresh(a)
    slack = 3 * 2 * max(32, 2 * (os.cpu_count() or 1)) * 3 * os.sysconf("SC_PAGE_SIZE")
    assert rss > 0 and abs(first[a][1] - rss) <= slack  # (stat's rss: per-CPU deltas pending)
    assert abs(first[a][0] - cpu) <= 20_000_000
    # a group that appears later is found without a full pass (its processes are new pids)
    b = _group(groups, "sleep 600")
    second = scanner.usage({a, b}, now=1.0)
    assert set(second) == {a, b} and second[b][1] > 0
    # a member that dies leaves the sum
    psutil.Process(a).children()[0].kill()
    wait_for(lambda: len([c for c in psutil.Process(a).children()  # type: ignore[operator]
                          if c.status() != psutil.STATUS_ZOMBIE]) == 1, 10.0, 0.02)
    assert scanner.usage({a, b}, now=2.0)[a][1] < first[a][1]  # a whole sleep's pages went
    assert scanner.usage({b}, now=3.0).keys() == {b}
    # a leader seen in its parent's group before its setsid (a container's process, forked by
    # its monitor) is read all the same once its group is wanted
    scanner._pgid[str(b)] = os.getpgid(0)
    assert scanner.usage({b}, now=4.0)[b][1] > 0


def test_log_usage_follows_growth_rotation_and_removal(tmp_path: Path) -> None:
    cdir = tmp_path / "default_web_uid1" / "app"
    cdir.mkdir(parents=True)
    (cdir / "0.log").write_bytes(b"a" * 10)
    assert log_usage(str(tmp_path)) == {("uid1", "app"): (10, 1)}
    with (cdir / "0.log").open("ab") as f:  # the live file grows: no folder change
        f.write(b"b" * 5)
    assert log_usage(str(tmp_path)) == {("uid1", "app"): (15, 1)}
    (cdir / "0.log").rename(cdir / "0.log.20260101-000000")  # rotated, a new live file
    (cdir / "0.log").write_bytes(b"c")
    assert log_usage(str(tmp_path)) == {("uid1", "app"): (16, 2)}
    (cdir / "1.log").write_bytes(b"dd")  # restarted: 1.log is live, 0.log frozen
    with (cdir / "1.log").open("ab") as f:
        f.write(b"e")
    assert log_usage(str(tmp_path)) == {("uid1", "app"): (19, 3)}
    (tmp_path / "default_db_uid2" / "db").mkdir(parents=True)  # a second pod, no log yet
    assert log_usage(str(tmp_path)) == {("uid1", "app"): (19, 3), ("uid2", "db"): (0, 0)}
    for f in cdir.iterdir():
        f.unlink()
    cdir.rmdir()
    assert log_usage(str(tmp_path)) == {("uid2", "db"): (0, 0)}
