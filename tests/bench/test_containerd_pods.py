"""bench/containerd_pods.py's helpers that need no containerd: reading `strace -c` output and
finding the daemon of an instance dir (the measurements themselves are the bench's)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import containerd_pods as cp

STRACE_C = """\
strace: Process 4242 attached with 9 threads
strace: Process 4242 detached
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 41.10    0.004110          23       177        12 futex
 30.00    0.003000          11       264           poll
  0.00    0.000000           0         3           getpid
------ ----------- ----------- --------- --------- ----------------
100.00    0.010000          22       444        12 total
"""


def test_strace_summary_is_read_as_calls_per_syscall() -> None:
    assert cp._strace_counts(STRACE_C) == {"futex": 177, "poll": 264, "getpid": 3}


def test_the_daemon_of_an_instance_is_its_pid_file_when_that_is_a_containerd(
        tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    sock = str(tmp_path / "run" / "containerd.sock")
    assert cp.daemon_pid(sock) is None  # no pid file
    (tmp_path / "containerd.pid").write_text(f"{os.getpid()}\n")
    assert cp.daemon_pid(sock) is None  # this process is not a containerd
