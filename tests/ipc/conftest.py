"""Fixtures for bus tests: a bus proxy in the test process and real owner/replica processes."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from podvisor.ipc.bus import BusProxy
from podvisor.ipc.paths import RunPaths

PROCS = Path(__file__).parent / "procs"


class Proc:
    """A child process speaking lines on stdin/stdout, stopped by PID at teardown."""

    def __init__(self, script: str, root: Path) -> None:
        # stdout is read from its fd and split into lines here: reading it through the file
        # object could leave a second line in that object's buffer while select() waits on an
        # empty pipe (a replica printing two states at once then looked silent).
        self.popen = subprocess.Popen(
            [sys.executable, str(PROCS / script), str(root)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        )
        assert self.popen.stdout is not None
        self._fd = self.popen.stdout.fileno()
        self._pending = b""

    def send(self, line: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def readline(self, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            ready, _, _ = select.select([self._fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError(f"no output from {self.popen.args} in {timeout}s")
            chunk = os.read(self._fd, 65536)
            if not chunk:
                raise EOFError(f"{self.popen.args} exited with {self.popen.wait()}")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode().strip()

    def wait_line(self, pred: Any, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self.readline(max(0.01, deadline - time.monotonic()))
            if pred(line):
                return line
            if time.monotonic() > deadline:
                raise TimeoutError("condition not met")

    def wait_state(self, pred: Any, timeout: float = 20.0) -> dict[str, Any]:
        """For replica processes: the first JSON state line that satisfies ``pred``."""
        line = self.wait_line(lambda s: pred(json.loads(s)), timeout)
        return dict(json.loads(line))

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)
        for f in (self.popen.stdin, self.popen.stdout):
            if f is not None:
                f.close()


@pytest.fixture
def bus() -> Iterator[tuple[zmq.Context[Any], RunPaths]]:
    root = Path(tempfile.mkdtemp(prefix="pvbus", dir="/tmp"))
    paths = RunPaths(root)
    paths.ensure()
    zctx: zmq.Context[Any] = zmq.Context()
    proxy = BusProxy(zctx, paths)
    proxy.start()
    yield zctx, paths
    proxy.stop()
    zctx.destroy(linger=0)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def procs(bus: tuple[zmq.Context[Any], RunPaths]) -> Iterator[Any]:
    started: list[Proc] = []

    def start(script: str) -> Proc:
        p = Proc(script, bus[1].root)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
