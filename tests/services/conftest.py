"""Fixtures for the CRI contract suite and the embedded runtime's own tests.

- ``EmbeddedRuntime``: the real standalone runtime process (``python -m
  podvisor.services.runtime``) on a socket in a short temp dir; kill -9 / restart for durability
  tests; always stopped by PID at teardown.
- ``cri_runtime`` (params ``embedded``, ``containerd``, ``fake``): a ``RuntimeUnderTest`` with a
  RuntimeClient, the image to use and config builders. ``fake`` is ``FakeRuntimeClient``, the
  unit tests' fake, held to the same contract (``runs_processes(rt, what)`` skips what a fake
  that runs no process cannot show). containerd comes from
  ``tests/support/containerd.py`` (``containerd_or_skip()``, owned by the containerd engineer) and
  is skipped with its reason when unavailable.
- ``manifests`` (a static-pod folder) and ``cgroup_root`` (a per-test ``cgroupRoot``, removed on
  every hierarchy): what the end-to-end tests of pods give their agent.
- ``sandbox_config`` / ``container_config``: the one place test configs are built; they apply
  what containerd on these machines needs (host network with empty hostname, PID namespace
  CONTAINER in sandbox and container) to both runtimes alike.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError, RuntimeClient, new_runtime_client
from podvisor.services.cri.fake import FakeRuntimeClient
from tests.conftest import wait_for_impl

HERE = Path(__file__).resolve().parent
TEST_LABEL = "podvisor.test/run"


def poll(predicate: Callable[[], Any], timeout: float = 15.0, message: str = "") -> Any:
    """Poll until truthy (the top-level helper, at a 5 ms interval); AssertionError after
    ``timeout``."""
    return wait_for_impl(predicate, timeout, 0.005, message)


class EmbeddedRuntime:
    """The standalone embedded runtime as a real subprocess."""

    def __init__(self, base: Path, env: dict[str, str] | None = None) -> None:
        self.base = base
        self.env = {**os.environ, **(env or {})}
        self.root = base / "root"
        self.socket = base / "cri.sock"
        self.stderr_path = base / "runtime.stderr"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = new_runtime_client(f"unix://{self.socket}", timeout=10.0)

    def start(self) -> None:
        self.launch()
        self.wait_up()

    def launch(self, env: dict[str, str] | None = None) -> None:
        """Start the process, not waiting for it to serve (``wait_up``); ``env`` replaces the
        environment for this start only."""
        with self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "podvisor.services.runtime", "--root", str(self.root),
                 "--socket", str(self.socket)],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                env=self.env if env is None else env)

    def wait_up(self) -> None:
        poll(self._up, 30.0, "embedded runtime to answer Version")

    def wait_died(self, timeout: float = 30.0) -> int:
        """The process exited by itself (a crash point): its return code."""
        assert self.proc is not None
        code = self.proc.wait(timeout)
        self.proc = None
        return code

    def _up(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"runtime exited {self.proc.returncode}: {self.stderr()}")
        try:
            self.client.version()
        except CriError:
            return False
        return True

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-5000:]


def cleanup(client: RuntimeClient, run_label: str | None = None) -> None:
    """Stop and remove every sandbox (and so container) this test made."""
    want = pb.PodSandboxFilter(label_selector={TEST_LABEL: run_label}) if run_label else None
    def removed(cid: str) -> bool:
        try:
            client.stop_container(cid, 0)
            client.remove_container(cid)
        except CriError:
            return False  # containerd can briefly refuse ("still running") right after a stop
        return True

    for sb in client.list_pod_sandbox(want):
        for c in client.list_containers(pb.ContainerFilter(pod_sandbox_id=sb.id)):
            poll(lambda cid=c.id: removed(cid), 30.0, f"removal of container {c.id[:12]}")
        client.stop_pod_sandbox(sb.id)
        client.remove_pod_sandbox(sb.id)


@dataclass
class RuntimeUnderTest:
    name: str
    client: RuntimeClient
    image: str
    tmp: Path
    run_label: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    embedded: EmbeddedRuntime | None = None
    cgroup_parent: str = ""  # containerd: pods get f"{cgroup_parent}/pod{uid}"
    pod_cgroups: list[str] = field(default_factory=list)
    commands: dict[str, list[str]] = field(default_factory=dict)  # container -> its command

    def sandbox_config(self, name: str = "pod", labels: dict[str, str] | None = None,
                       log_dir: Path | None = None) -> pb.PodSandboxConfig:
        log_directory = log_dir if log_dir is not None else self.tmp / "logs" / name
        log_directory.mkdir(parents=True, exist_ok=True)
        ns = pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER)
        uid = f"{self.run_label}-{name}"
        cgroup = f"{self.cgroup_parent}/pod{uid}" if self.cgroup_parent else ""
        if cgroup:
            self.pod_cgroups.append(cgroup)
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, namespace="contract", uid=uid, attempt=0),
            hostname="", log_directory=str(log_directory),
            labels={TEST_LABEL: self.run_label, **(labels or {})},
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=cgroup,
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=ns)),
        )

    def container_config(self, name: str, cmd: Sequence[str], *, attempt: int = 0,
                         env: dict[str, str] | None = None,
                         labels: dict[str, str] | None = None) -> pb.ContainerConfig:
        ns = pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER)
        return pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=attempt),
            image=pb.ImageSpec(image=self.image), command=list(cmd),
            envs=[pb.KeyValue(key=k, value=v) for k, v in (env or {}).items()],
            labels=labels or {}, log_path=f"{name}/{attempt}.log",
            linux=pb.LinuxContainerConfig(
                security_context=pb.LinuxContainerSecurityContext(namespace_options=ns)),
        )

    # --- conveniences ---
    def run(self, name: str = "pod", labels: dict[str, str] | None = None
            ) -> tuple[str, pb.PodSandboxConfig]:
        config = self.sandbox_config(name, labels)
        return self.client.run_pod_sandbox(config), config

    def start(self, sandbox: tuple[str, pb.PodSandboxConfig], name: str, cmd: Sequence[str],
              **kw: Any) -> str:
        sid, sconfig = sandbox
        cid = self.client.create_container(sid, self.container_config(name, cmd, **kw), sconfig)
        self.client.start_container(cid)
        self.commands[cid] = list(cmd)
        return cid

    def wait_exited(self, cid: str, timeout: float = 15.0) -> pb.ContainerStatus:
        fake = isinstance(self.client, FakeRuntimeClient)  # no process: play the command's exit
        if fake and self.client.container_status(cid).state == pb.CONTAINER_RUNNING:
            assert isinstance(self.client, FakeRuntimeClient)
            self.client.exit_container(cid, _exit_code_of(self.commands.get(cid, [])))
        def exited() -> pb.ContainerStatus | None:
            st = self.client.container_status(cid)
            return st if st.state == pb.CONTAINER_EXITED else None
        return poll(exited, timeout, f"container {cid[:12]} to exit")


def _exit_code_of(cmd: Sequence[str]) -> int:
    """What the contract's short commands exit with: ``true`` 0, ``false`` 1, ``sh -c 'exit N'``
    N (the fake runs no process; its harness plays the exit)."""
    if list(cmd[:2]) == ["sh", "-c"] and len(cmd) == 3 and cmd[2].startswith("exit "):
        return int(cmd[2].split()[1])
    return 1 if list(cmd) == ["false"] else 0


def _load_containerd_module() -> Any:
    """tests/support/containerd.py, imported by the one name its owner asks for (one session
    cache, so one containerd instance per session)."""
    if not (HERE.parent / "support" / "containerd.py").exists():
        return None
    return importlib.import_module("tests.support.containerd")


def short_tmp(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@pytest.fixture(scope="session", autouse=True)
def _containerd_session(request: pytest.FixtureRequest) -> None:
    """Start the session's containerd (if any containerd-parametrised test was collected) before
    any test's leak check takes its "before" snapshot: containerd outlives single tests."""
    wanted = any("[containerd" in item.name for item in request.session.items)
    module = _load_containerd_module() if wanted else None
    if module is None:
        return
    # Each containerd test reports the same (cached) outcome itself.
    with contextlib.suppress(pytest.skip.Exception, pytest.fail.Exception):
        module.containerd_or_skip()


@contextlib.contextmanager
def running_embedded(prefix: str = "pvrt",
                     env: dict[str, str] | None = None) -> Iterator[EmbeddedRuntime]:
    """A started standalone runtime in a short temp dir; everything it made is removed and it
    is stopped (by PID) on exit, even if the test killed it."""
    base = short_tmp(prefix)
    rt = EmbeddedRuntime(base, env)
    rt.start()
    try:
        yield rt
    finally:
        try:
            if rt.proc is None:
                rt.start()
            cleanup(rt.client)
        finally:
            rt.stop()
            rt.client.close()
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def embedded_runtime() -> Iterator[EmbeddedRuntime]:
    with running_embedded() as rt:
        yield rt


@pytest.fixture(params=["embedded", pytest.param("containerd", marks=pytest.mark.containerd),
                        "fake"])
def cri_runtime(request: pytest.FixtureRequest) -> Iterator[RuntimeUnderTest]:
    tmp = short_tmp("pvct")
    try:
        if request.param == "fake":  # the unit tests' fake must not drift from the real ones
            yield RuntimeUnderTest("fake", FakeRuntimeClient(), "host", tmp)
            return
        if request.param == "embedded":
            rt: EmbeddedRuntime = request.getfixturevalue("embedded_runtime")
            yield RuntimeUnderTest("embedded", rt.client, "host", tmp, embedded=rt)
            return
        module = _load_containerd_module()
        if module is None:
            pytest.skip("containerd: tests/support/containerd.py (containerd_or_skip) not "
                        "available yet")
        handle = module.containerd_or_skip()
        client = new_runtime_client(handle.endpoint, timeout=30.0)
        under = RuntimeUnderTest("containerd", client, handle.image, tmp,
                                 cgroup_parent=handle.cgroup_parent)
        try:
            yield under
        finally:
            try:
                cleanup(client, under.run_label)
            finally:
                client.close()
                for cgroup in under.pod_cgroups:
                    module.remove_pod_cgroup(cgroup)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(params=["embedded", pytest.param("containerd", marks=pytest.mark.containerd)])
def pod_runtime(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """An agent's runtime for an end-to-end test of pods on both runtimes: ``config`` (the
    agent's config keys), ``image`` (one the runtime runs ``sh`` from) and, on containerd,
    ``endpoint``. containerd is the session's instance (skipped with the reason when there is
    none), its pods under a per-test ``cgroupRoot`` removed at the end: name it before ``agent``
    in a test's parameters, so that it is set up first and torn down after the agent stopped."""
    if request.param == "embedded":
        yield {"config": {}, "image": "host"}
        return
    from tests.support.containerd import containerd_or_skip, remove_pod_cgroup

    handle = containerd_or_skip()
    cgroup_root = f"/podvisor-test-{secrets.token_hex(4)}"
    yield {"config": {"runtimeEndpoint": handle.endpoint, "cgroupRoot": cgroup_root,
                      "stopPodsOnExit": True}, "image": handle.image,
           "endpoint": handle.endpoint}
    remove_pod_cgroup(cgroup_root)


@pytest.fixture
def manifests() -> Iterator[Path]:
    """A static-pod folder (``staticPodPath``) in a short temp dir, removed after the test."""
    d = short_tmp("pvman")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def cgroup_root() -> Iterator[str]:
    """A per-test ``cgroupRoot`` (``/podvisor-test-<random>``), its folders removed on every
    hierarchy after the test: name it before ``agent``, so it is removed after the agent
    stopped."""
    from tests.support.containerd import remove_pod_cgroup

    root = f"/podvisor-test-{secrets.token_hex(4)}"
    yield root
    remove_pod_cgroup(root)


def only_embedded(rt: RuntimeUnderTest, why: str) -> None:
    if rt.name != "embedded":
        pytest.skip(f"{rt.name}: {why}")


def runs_processes(rt: RuntimeUnderTest, what: str) -> None:
    """Skip on the fake: it runs no process, so it has no output, logs, exec or stats (what
    it does model, states, errors, lists and exit codes, is held to the contract)."""
    if rt.name == "fake":
        pytest.skip(f"fake: runs no process ({what})")


def os_pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(name="poll")
def poll_fixture() -> Callable[..., Any]:
    """``poll(predicate, timeout=15.0, message="")`` for test modules (they cannot import
    conftest under --import-mode=importlib)."""
    return poll
