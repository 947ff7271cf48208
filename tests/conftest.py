"""The suite: its layout, and the plumbing every test shares (owned by the supervisor engineer).

Layout (issue 23; checked by tests/shape/test_tests_shape.py):

- A test lives in the mirror of the folder of the code whose behaviour it asserts: `tests/F/`
  for folder `F` of the repository. `tests/services/pleg/` tests `services/pleg/`,
  `tests/supervisor/` `supervisor/`, `tests/cli/` `cli/` (podvisorctl, chaos), `tests/ipc/`,
  `tests/common/`, `tests/bench/`, `tests/deploy/containerd/` likewise. File names stay
  `test_<what>.py`.
- End-to-end tests (a whole agent: the `agent` fixture, `podvisor run`) follow the same rule,
  named `test_e2e_<what>.py`: they go to the folder of the code that owns the behaviour they
  assert, not of the tool they observe it with. A restart policy, a pod's containers, volumes,
  images or resources -> `services/syncloop/`; statuses (in /pods or in the API) ->
  `services/status/`; manifests and API pods coming in -> `services/sources/`; the read-only and
  main ports -> `services/server/`; the ops port -> `services/ops/`; the pod model's fields
  (downward API, defaults) -> `services/pod/`; starting, stopping, reloading and supervising
  the agent -> `supervisor/`; what podvisorctl prints and does -> `cli/`. One that asserts
  several owners' behaviour goes with the one its name and docstring lead with.
- The CRI contract suite (`test_contract_*.py`, every runtime through `cri_runtime`) tests the
  interface `services/cri/` declares: `tests/services/cri/`. Its fixtures (the runtimes under
  test) are in `tests/services/conftest.py`, so the runtime's own tests reach them too.
- A helper (a module that is not a test) used by one folder's tests sits beside them
  (`tests/services/ops/opsagent.py`). One used by several folders' tests is in
  `tests/support/`: `lifecycle.py` (agent configs and pod manifests), `kubeapi/` (the stand-in
  API server), `containerd.py` (import it as `tests.support.containerd` only), `registry.py`,
  `spdy_client.py`, `mapvalues.py`, `plegs.py`, `testservices/` (the agent's test services, on
  its PYTHONPATH). The tests of those helpers and of this file sit in `tests/support/` too.
- `tests/shape/` holds checks over the whole repository (its shape, its packaging).
- `tests/` itself holds this file only. Every module is imported by its path
  (`from tests.support.lifecycle import ...`): pytest runs with `--import-mode=importlib`.
- One fake clock, `podvisor.common.FakeClock`; one fake child context,
  `podvisor.common.FakeChildContext`. A test defines no clock class and builds no
  `ChildContext` by hand (the shape check says where one does).

Plumbing:

- Workers: `make test TEST_WORKERS=3` runs the suite in 3 pytest-xdist workers (`make test`: one
  process); each module's tests stay in one worker, and the tests that share a machine-wide
  resource (the session's containerd, bridges, routes and iptables rules) run in one worker one
  after another (`worker_group`, below). Every fixture here is per worker: each worker is its
  own subreaper with its own leak check.
- The pytest process is a child subreaper (PR_SET_CHILD_SUBREAPER), so descendants orphaned by
  a test re-parent to it and can be found.
- SIGINT is not ignored in the pytest process, however it was started (`_default_sigint`), so
  the processes a test starts take Ctrl-C as from a terminal.
- `_no_leaked_processes` (autouse): fails a test that leaves a new descendant process alive, then
  kills those by PID so one leak does not cascade. Opt out with `@pytest.mark.no_leak_check`.
- `wait_for(predicate, timeout=..., interval=..., message=...)`: poll until truthy (no sleeps to
  synchronise).
- `agent(config=None, ...)`: start `podvisor run` as a real subprocess in a short temp rootDir;
  returns an `AgentHandle` (`.call()`, `.status()`, `.ctl()`, `.wait_state()`, `.stop()`,
  `.paths`). Stopped by PID at teardown.
- `ctl(handle, *args)`: run `podvisorctl --root-dir <root> *args`, returns CompletedProcess.
- The fresh-boot guard (issue 10): `time.monotonic()` in the pytest process reads about
  `--uptime` seconds (default 3) at the session's start, as on a machine booted moments ago, so
  a test that works only where the machine has been up long enough (a fake monotonic clock at
  1000.0 mixed with a real one) fails on every machine, in `make test` and CI alike.
  `--uptime real` turns it off. tests/support/test_clock_guard.py proves it is on. Child processes
  (agents, services under test) keep the real clock: they have their own object graphs.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
import zmq

from podvisor.ipc.bus import BusProxy, Publisher
from podvisor.ipc.clock import SYSTEM_CLOCK, Clock
from podvisor.ipc.clone import MapOwner
from podvisor.ipc.maps import MapSpec, declared
from podvisor.ipc.paths import RunPaths
from podvisor.testing.agent import AgentProcess

PR_SET_CHILD_SUBREAPER = 36
REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TEST_SERVICES = REPO / "tests" / "support" / "testservices"
T = TypeVar("T")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--uptime", default="3", metavar="SECONDS|real",
        help="time.monotonic() reads about SECONDS at the session's start, as on a machine just "
             "booted (default 3); 'real' keeps the machine's clock")


REAL_MONOTONIC = time.monotonic
MONOTONIC_OFFSET = 0.0  # what the fresh-boot guard subtracts from the real monotonic clock


def _fresh_boot_clock(uptime: str) -> None:
    """Shift ``time.monotonic`` for the whole session (a constant offset: it still never goes
    back, and differences are unchanged). ``SystemClock`` looks it up at each call."""
    global MONOTONIC_OFFSET
    if uptime == "real":
        return
    MONOTONIC_OFFSET = max(0.0, REAL_MONOTONIC() - float(uptime))
    offset = MONOTONIC_OFFSET

    def monotonic() -> float:
        return REAL_MONOTONIC() - offset

    time.monotonic = monotonic


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "no_leak_check: skip the leaked-process check")
    config.addinivalue_line("markers", "xdist_group(name): the worker group (worker_group)")
    _fresh_boot_clock(str(config.getoption("--uptime")))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _default_sigint()


def _default_sigint() -> None:
    """A suite started in the background by a non-interactive shell (``make test &``, a CI
    runner) inherits SIGINT ignored (POSIX: an asynchronous list ignores SIGINT and SIGQUIT),
    and so would every process a test starts: the tests that Ctrl-C a ``podvisorctl logs
    --follow`` would wait for it forever. A handler of our own is reset to the default in every
    child at its exec, so the children get Python's usual KeyboardInterrupt."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# --- workers (pytest-xdist) --------------------------------------------------------------------

# The suite may run in worker processes (`make test TEST_WORKERS=3`: `-n 3 --dist loadgroup`).
# Each test gets a group here; a group runs in one worker, its tests one after another, as if alone:
# - a module is its own group: its tests may share what they name (a marker in argv, a cgroup
#   folder, a port base) and were written to run one after another;
# - "node": every module that reaches the one containerd of the session, and the modules that
#   make bridges, routes and iptables rules. An agent on containerd owns every pod in its
#   k8s.io namespace (it stops the sandboxes it did not make), and the contract and
#   exactly-once tests count what is there; the /24 of a bridge is picked from this machine's
#   routes, then added; CNI's portmap checks, then makes, its iptables chains (two at once
#   fail: "Chain 'CNI-HOSTPORT-DNAT' does not exist", seen in a run in workers).
CONTAINERD_USE = re.compile(r"containerd_or_skip|\bpod_runtime\b|\bcri_runtime\b|"
                            r"support\.containerd|support import containerd")
HOST_NETWORK = ("tests/services/runtime/test_e2e_embedded_network.py",
                "tests/services/runtime/test_embedded_network.py",
                "tests/deploy/containerd/test_containerd_network_setup.py")


def worker_group(path: Path) -> str:
    """The group a test module's tests run in (see above)."""
    rel = path.resolve().relative_to(REPO).as_posix()
    if rel in HOST_NETWORK or CONTAINERD_USE.search(path.read_text(encoding="utf-8")):
        return "node"
    return rel


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """In the controller of workers, before they start: one containerd for all of them."""
    if session.config.pluginmanager.has_plugin("dsession"):
        from tests.support.containerd import share_with_workers
        share_with_workers()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups: dict[Path, str] = {}
    for item in items:
        path = Path(item.path)
        if path not in groups:
            groups[path] = worker_group(path)
        item.add_marker(pytest.mark.xdist_group(groups[path]))


# --- polling -----------------------------------------------------------------------------------


def wait_for_impl(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02,
                  message: str = "", pump: Callable[[], object] | None = None) -> T:
    """Call `predicate` until it returns something truthy (returned); AssertionError after
    `timeout` seconds, with `message` and the last value. `pump`, when given, runs before each
    check (e.g. to drain a test's sockets into the state the predicate reads)."""
    deadline = time.monotonic() + timeout
    while True:
        if pump is not None:
            pump()
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for "
                                 f"{message or predicate}: last value {value!r}")
        time.sleep(interval)


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    return wait_for_impl


# --- leaked processes --------------------------------------------------------------------------


def _descendants() -> dict[int, psutil.Process]:
    try:
        return {p.pid: p for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return {}


class MapBus:
    """A real bus (the proxy) and owners of the given replicated maps in ``root`` (a spec, or
    the name of a declared one), by name in ``maps``: what a service under test replicates
    from. ``serve`` does what the owners' loops do."""

    def __init__(self, root: Path, maps: Sequence[MapSpec[Any] | str],
                 clock: Clock = SYSTEM_CLOCK, **owner_options: Any) -> None:
        self.root = root
        self.clock = clock
        self.paths = RunPaths(root)
        self.paths.ensure()
        self.zctx: zmq.Context[Any] = zmq.Context()
        self.proxy = BusProxy(self.zctx, self.paths)
        self.proxy.start()
        self.pub = Publisher(self.zctx, self.paths, "test", clock=clock)
        specs = [declared(m) if isinstance(m, str) else m for m in maps]
        self.maps: dict[str, MapOwner[Any]] = {
            spec.name: MapOwner(self.zctx, self.paths, self.pub, spec, clock=clock,
                                **owner_options) for spec in specs}

    def serve(self) -> None:
        """Answer snapshot requests and send idle heartbeats."""
        for owner in self.maps.values():
            owner.serve()
            owner.tick(self.clock.monotonic())

    def close(self) -> None:
        for owner in self.maps.values():
            owner.close()
        self.pub.close()
        self.proxy.stop()
        self.zctx.destroy(linger=0)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def process_gone(proc: psutil.Process | int) -> bool:
    """The process exited (a zombie counts as exited). Never raises, whenever it is reaped:
    checking ``is_running()`` and then ``status()`` races with the reaper."""
    try:
        return not _alive(proc if isinstance(proc, psutil.Process) else psutil.Process(proc))
    except psutil.Error:
        return True


def _reap_new_zombies(before: set[int]) -> None:
    """Reap orphans that re-parented to us and died (only ones born during the test)."""
    for pid, proc in _descendants().items():
        try:
            if pid in before or proc.ppid() != os.getpid() or _alive(proc):
                continue
            os.waitpid(pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            pass


@pytest.fixture(autouse=True)
def _no_leaked_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    before = set(_descendants())
    yield
    if request.node.get_closest_marker("no_leak_check"):
        return
    new = [p for pid, p in _descendants().items() if pid not in before and _alive(p)]
    if new:
        _, alive = psutil.wait_procs(new, timeout=5.0)
        alive = [p for p in alive if _alive(p)]
    else:
        alive = []
    described = []
    for proc in alive:
        try:
            described.append(f"{proc.pid} {' '.join(proc.cmdline())[:200]}")
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5.0)
    _reap_new_zombies(before)
    if described:
        pytest.fail("test left processes behind (killed now):\n  " + "\n  ".join(described))


# --- the agent ---------------------------------------------------------------------------------


def short_tmp_dir(prefix: str = "pv") -> Path:
    """A short temp dir (unix socket paths are limited to 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


class AgentHandle(AgentProcess):
    """A `podvisor run` subprocess with its config, rootDir and a control client: the core
    every harness shares (`podvisor.testing.agent.AgentProcess`, also under the
    `podvisor_node` fixture and `podvisor chaos`), started at once."""

    def __init__(self, root: Path, config: dict[str, Any], extra_args: list[str],
                 env: dict[str, str]) -> None:
        super().__init__(root, config, extra_args, env)


def base_config(root: Path) -> dict[str, Any]:
    """A test config: built-ins off, brisk heartbeats."""
    return {
        "rootDir": str(root),
        "nodeName": "test-node",
        "supervision": {"builtins": False, "heartbeatInterval": "200ms",
                        "shutdownTimeout": "15s", "logLevel": "debug"},
    }


@pytest.fixture
def agent() -> Iterator[Callable[..., AgentHandle]]:
    """Factory: `agent(processes={...}, config=None, extra_args=(), pythonpath=(), wait=True)`.
    `processes` goes to `supervision.processes`; `config` (a full dict) replaces the base."""
    handles: list[AgentHandle] = []
    dirs: list[Path] = []

    def start(processes: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
              extra_args: tuple[str, ...] = (), pythonpath: tuple[str, ...] = (),
              wait: bool = True) -> AgentHandle:
        tmp = short_tmp_dir()
        dirs.append(tmp)
        cfg = config if config is not None else base_config(tmp / "root")
        cfg.setdefault("rootDir", str(tmp / "root"))
        # The fixed default ports (main 10250, ops 9001) stay off unless a test asks for them,
        # so agents of different tests (and a user's agent) never compete for them.
        cfg.setdefault("port", 0)
        cfg.setdefault("opsPort", 0)
        if processes:
            cfg.setdefault("supervision", {})["processes"] = processes
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [*pythonpath, str(TEST_SERVICES), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        handle = AgentHandle(tmp, cfg, list(extra_args), env)
        handles.append(handle)
        if wait:
            handle.wait_ready()
        return handle

    yield start
    for handle in handles:
        handle.stop()
        handle.remove_cgroup_root()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def ctl() -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(handle: AgentHandle, *args: str) -> subprocess.CompletedProcess[str]:
        return handle.ctl(*args)
    return run
