"""The start path with more than 1,024 descriptors held open (issue 16: ~1,000 containers).

The runtime holds descriptors that grow with its containers; ``select()`` cannot watch one
above 1023, so a start whose reply pipe or spare socket lands there failed with
``ValueError('filedescriptor out of range in select()')``. Here every descriptor below 1,100
is taken before the starts, so each new one (reply pipes, spare sockets, log files, pidfds)
lands above 1,024; the starts, the exit and the stop must all work, with the C monitor and the
Python one. Also: the soft RLIMIT_NOFILE is raised to the hard limit at start.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.runtime.engine import Engine
from podvisor.services.runtime.zygote import wait_readable
from tests.services.conftest import poll

ABOVE = 1100  # every descriptor below this is held open during the starts


class _Log:
    def info(self, event: str, **fields: Any) -> None: ...
    def warning(self, event: str, **fields: Any) -> None: ...
    def error(self, event: str, **fields: Any) -> None: ...


@contextlib.contextmanager
def _held_descriptors(above: int) -> Iterator[list[int]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < above + 200:
        pytest.skip(f"the hard RLIMIT_NOFILE ({hard}) is too low to hold {above} descriptors")
    if soft != resource.RLIM_INFINITY and soft < above + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, above + 1000)
                                                    if hard != resource.RLIM_INFINITY
                                                    else above + 1000, hard))
    held: list[int] = []
    try:
        while True:  # fill every gap below ``above``: new descriptors land above it
            fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
            held.append(fd)
            if fd >= above:
                break
        yield held
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(params=["native", "python"])
def engine(request: pytest.FixtureRequest,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, Path]]:
    if request.param == "python":
        monkeypatch.setenv("PODVISOR_MONITOR", "python")
    root = Path(tempfile.mkdtemp(prefix="pvfd", dir="/tmp"))  # short: unix socket path limit
    eng = Engine(root / "root", _Log())
    eng.start()
    try:
        yield eng, root
    finally:
        for sb in eng.sandboxes():
            eng.stop_sandbox(sb.id)
            eng.remove_sandbox(sb.id)
        eng.close()
        shutil.rmtree(root, ignore_errors=True)


def test_poll_watches_a_descriptor_above_1024() -> None:
    with _held_descriptors(ABOVE):
        r, w = os.pipe()
        try:
            assert r > 1024
            assert not wait_readable(r, 0)
            os.write(w, b"x")
            assert wait_readable(r, 1.0)
        finally:
            os.close(r)
            os.close(w)


def test_start_path_with_descriptors_above_1024(engine: tuple[Engine, Path]) -> None:
    eng, root = engine
    with _held_descriptors(ABOVE):
        probe = os.open("/dev/null", os.O_RDONLY)
        os.close(probe)
        assert probe > 1024  # the starts below get descriptors above select()'s range
        sid = eng.run_sandbox(pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name="fds", namespace="n", uid="uid-fds"),
            log_directory=str(root / "logs")), "")
        cids = [eng.create_container(sid, pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=f"c{i}"), image=pb.ImageSpec(image="host"),
            command=["sh", "-c", "echo up; exec sleep 1000"] if i else ["sh", "-c", "exit 3"],
            log_path=f"c{i}.log")) for i in range(4)]
        for cid in cids:
            eng.start_container(cid)  # was: ValueError from select() in the reply wait
        poll(lambda: eng.container(cids[0]).exited, message="exit seen above fd 1024")
        exited = eng.container(cids[0]).exited
        assert exited is not None and exited.exit_code == 3
        for cid in cids[1:]:
            assert eng.container(cid).started is not None
            eng.stop_container(cid, 5)
            stopped = eng.container(cid).exited
            assert stopped is not None


def test_soft_nofile_limit_raised_to_hard() -> None:
    """A process started with a soft limit of 1,024 gets its hard limit after the raise."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 1024:
        pytest.skip(f"the hard RLIMIT_NOFILE is {hard}: nothing to raise")

    # The child lowers its own soft limit first: a preexec_fn would fork this (threaded,
    # gRPC-using) test process, which gRPC's fork handlers may abort.
    code = ("import resource; "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, (1024, {hard!r})); "
            "from podvisor.ipc.rlimits import raise_nofile_limit;"
            "print(raise_nofile_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert out[0] == "(1024,"
    assert int(out[-1]) > 1024
    assert int(out[1].rstrip(")")) == int(out[-1])
