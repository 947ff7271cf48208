"""containerd for tests: the instance CI started, or one private instance per pytest session.

Import it as `tests.support.containerd` only (pytest's importlib mode makes `tests.support` a
namespace package), so the session has one cache and one instance.

`containerd_or_skip()` returns a `ContainerdHandle`, the same one for the whole session:
- env `PODVISOR_CONTAINERD_ENDPOINT=unix:///...` set (CI ran `.ci/containerd.sh`): that instance
  is used, never stopped here. If it does not answer CRI, the calling test FAILS (CI said it is up).
- else, as root with containerd installed: `deploy/containerd/start.sh DIR` starts a private
  instance in a fresh `/tmp/podvisor-ctrd-*` dir, and `deploy/containerd/stop.sh --purge DIR`
  stops it at interpreter exit (or at `stop_session_instance()`).
- else `pytest.skip` with the reason: not root / containerd not installed / start failed: <why>.

Processes: containerd runs in its own session. tests/conftest.py makes pytest a child subreaper,
so containerd and every containerd-shim re-parent to pytest: start the instance BEFORE the
per-test leak check's "before" snapshot (a session- or module-scoped fixture calling
`containerd_or_skip()`; tests/services/conftest.py does), and remove every pod a test makes in
that test (shims exit with their sandbox; their zombies are reaped by the leak fixture). The
daemon's pid is recorded with `register_session_process(pid)`; `session_processes()` lists such
session-wide pids for a leak check that wants an explicit allow-list.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from cri_api.v1 import api_pb2, api_pb2_grpc

from podvisor.testing.agent import remove_cgroup_tree

ENV_ENDPOINT = "PODVISOR_CONTAINERD_ENDPOINT"
DEPLOY_DIR = Path(__file__).resolve().parents[2] / "deploy" / "containerd"
DEFAULT_IMAGE = "localhost/podvisor/busybox:1"
DEFAULT_PAUSE_IMAGE = "localhost/podvisor/pause:1"
DEFAULT_CGROUP_PARENT = "/podvisor-containerd"
CGROUP_ROOT = Path("/sys/fs/cgroup")
READY_TIMEOUT = 30.0
START_TIMEOUT = 120.0

_session_pids: set[int] = set()


@dataclass(frozen=True)
class ContainerdHandle:
    endpoint: str  # "unix:///.../containerd.sock", usable as a grpc target as is
    image: str  # the busybox test image (sh, sleep, echo, cat, ... in /bin)
    pause_image: str  # the sandbox image named in the instance's config
    cgroup_parent: str  # root for pods' cgroup_parent: f"{cgroup_parent}/pod{uid}"
    instance_dir: Path | None  # the instance dir if this session started it, else None

    @property
    def socket_path(self) -> str:
        return self.endpoint.removeprefix("unix://")


@dataclass(frozen=True)
class _Outcome:
    handle: ContainerdHandle | None = None
    skip: str | None = None
    error: str | None = None


def register_session_process(pid: int) -> None:
    """Declare `pid` a process meant to outlive single tests (the leak check should allow it)."""
    _session_pids.add(pid)


def session_processes() -> frozenset[int]:
    """Pids registered by `register_session_process` (alive or not)."""
    return frozenset(_session_pids)


def containerd_or_skip() -> ContainerdHandle:
    """The session's containerd, or pytest.skip(reason) / pytest.fail(reason)."""
    outcome = _session_outcome()
    if outcome.error is not None:
        pytest.fail(outcome.error)
    if outcome.handle is None:
        pytest.skip(outcome.skip or "containerd unavailable")
    return outcome.handle


def share_with_workers() -> None:
    """Under pytest-xdist, in the controller before its workers start: the session's instance
    (the one CI started, or a private one started here) is handed to every worker through
    `PODVISOR_CONTAINERD_ENDPOINT`, so the workers share one containerd and none starts its own.
    When this machine has none, nothing is set and each worker skips with the reason."""
    if os.environ.get(ENV_ENDPOINT, "").strip():
        return
    outcome = _session_outcome()
    if outcome.handle is not None:
        os.environ[ENV_ENDPOINT] = outcome.handle.endpoint


def stop_session_instance() -> None:
    """Stop the instance this session started, if any (idempotent; also runs at exit)."""
    outcome = _session_outcome() if _session_outcome.cache_info().currsize else None
    if outcome is None or outcome.handle is None or outcome.handle.instance_dir is None:
        return
    _stop(outcome.handle.instance_dir)


def _stop(directory: Path) -> None:
    if (directory / "config.toml").exists():
        subprocess.run([str(DEPLOY_DIR / "stop.sh"), "--purge", str(directory)],
                       capture_output=True, text=True, timeout=120, check=False)
    else:
        shutil.rmtree(directory, ignore_errors=True)
    for pid in _session_pids:  # under a subreaping pytest, containerd is our child: reap it
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def instance_shims(handle: ContainerdHandle) -> list[int]:
    """Pids of the containerd-shim processes serving this instance (matched on `-address`)."""
    pids = []
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if argv and "containerd-shim" in argv[0] and _arg(argv, "-address") == handle.socket_path:
            pids.append(proc.pid)
    return pids


def remove_pod_cgroup(pod_cgroup_parent: str) -> None:
    """Remove a pod's (empty) cgroup folders in every hierarchy: containerd 1.6 leaves them."""
    remove_cgroup_tree(pod_cgroup_parent, CGROUP_ROOT)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `predicate` until true; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def _arg(argv: list[str], flag: str) -> str | None:
    for i, value in enumerate(argv[:-1]):
        if value == flag:
            return argv[i + 1]
    return None


@functools.cache
def _session_outcome() -> _Outcome:
    endpoint = os.environ.get(ENV_ENDPOINT, "").strip()
    if endpoint:
        handle = _handle_for(endpoint, None)
        problem = _wait_ready(handle)
        if problem:
            return _Outcome(error=f"{ENV_ENDPOINT}={endpoint} is set but {problem}")
        return _Outcome(handle=handle)
    if os.geteuid() != 0:
        return _Outcome(skip=f"containerd tests need root (euid {os.geteuid()}) "
                             f"or {ENV_ENDPOINT} pointing at a running containerd")
    missing = [tool for tool in ("containerd", "ctr", "containerd-shim-runc-v2", "runc")
               if shutil.which(tool) is None]
    if missing:
        return _Outcome(skip=f"containerd not installed (missing {', '.join(missing)}; "
                             f"run deploy/containerd/setup.sh as root)")
    return _start_private()


def _start_private() -> _Outcome:
    directory = Path(tempfile.mkdtemp(prefix="podvisor-ctrd-", dir="/tmp"))
    try:
        done = subprocess.run([str(DEPLOY_DIR / "start.sh"), str(directory)],
                              capture_output=True, text=True, timeout=START_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        done = subprocess.CompletedProcess(exc.cmd, 1, "", f"start.sh timed out: {exc.stderr!r}")
    pid_file = directory / "containerd.pid"
    if pid_file.exists():
        register_session_process(int(pid_file.read_text().strip()))
    handle = _handle_for(f"unix://{directory}/run/containerd.sock", directory)
    problem = None
    if done.returncode != 0:
        problem = "\n".join(done.stderr.strip().splitlines()[-8:])
    else:
        problem = _wait_ready(handle)
    if problem:
        _stop(directory)
        return _Outcome(skip=f"containerd start failed: {problem}")
    atexit.register(stop_session_instance)
    return _Outcome(handle=handle)


def _handle_for(endpoint: str, directory: Path | None) -> ContainerdHandle:
    """A handle; reads `instance.env` beside a socket made by deploy/containerd (if any)."""
    values: dict[str, str] = {}
    env_file = Path(endpoint.removeprefix("unix://")).parent.parent / "instance.env"
    if env_file.is_file():
        for line in env_file.read_text().splitlines():
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return ContainerdHandle(
        endpoint=endpoint,
        image=values.get("IMAGE", DEFAULT_IMAGE),
        pause_image=values.get("PAUSE_IMAGE", DEFAULT_PAUSE_IMAGE),
        cgroup_parent=values.get("CGROUP_PARENT", DEFAULT_CGROUP_PARENT),
        instance_dir=directory,
    )


def _wait_ready(handle: ContainerdHandle) -> str | None:
    """None once CRI answers Version and knows both images; else what is wrong."""
    deadline = time.monotonic() + READY_TIMEOUT
    problem = "no answer yet"
    with grpc.insecure_channel(handle.endpoint) as channel:
        runtime: Any = api_pb2_grpc.RuntimeServiceStub(channel)  # type: ignore[no-untyped-call]
        images: Any = api_pb2_grpc.ImageServiceStub(channel)  # type: ignore[no-untyped-call]
        while time.monotonic() < deadline:
            try:
                runtime.Version(api_pb2.VersionRequest(), timeout=5)
                missing = [ref for ref in (handle.image, handle.pause_image)
                           if not images.ImageStatus(api_pb2.ImageStatusRequest(
                               image=api_pb2.ImageSpec(image=ref)), timeout=5).image.id]
                if not missing:
                    return None
                problem = f"CRI does not know image(s) {', '.join(missing)}"
            except grpc.RpcError as exc:
                problem = f"CRI at {handle.endpoint} answered {exc.code().name}: {exc.details()}"
            time.sleep(0.1)
    return problem
