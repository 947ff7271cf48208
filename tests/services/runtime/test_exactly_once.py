"""Exactly once across crashes of the embedded runtime (issue 22; docs/ARCHITECTURE.md, "Exactly
once").

The runtime SIGKILLs itself at each step of the CRI start and stop paths (its crash points,
``PODVISOR_CRASH_AT=runtime:<step>``, engine.py ``STEPS``; once per test through
``PODVISOR_CRASH_ONCE_DIR``). A new runtime on the same root must, before it answers its first
call, hold every container process the dead one started in a record (RUNNING) or have none
(CREATED, EXITED, or no record); then a client that retries as the sync loop does (it reads the
runtime fresh and reuses what exists: actions.py) ends with exactly one process per container,
and none once the container is removed. ``PODVISOR_MONITOR_HOLD`` stops a monitor between its
container's start and started.json, so the windows after the fork and before the record are
reached every time, not by chance. Both monitors (C and Python) run the start path.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psutil
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.common.crashpoints import ENV_AT, ENV_ONCE_DIR
from podvisor.services.cri import CriError
from podvisor.services.runtime.engine import STEPS
from tests.services.conftest import (
    TEST_LABEL,
    EmbeddedRuntime,
    RuntimeUnderTest,
    cleanup,
    poll,
    short_tmp,
)

HOLD = "PODVISOR_MONITOR_HOLD"
STATE = {pb.CONTAINER_CREATED: "created", pb.CONTAINER_RUNNING: "running",
         pb.CONTAINER_EXITED: "exited"}


def sleepers(tag: str) -> list[psutil.Process]:
    """Live processes running ``sleep <tag>`` (the kernel's view, not the runtime's)."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["cmdline"] == ["sleep", tag] and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(p)
    return out


class Crashy:
    """A standalone runtime armed to SIGKILL itself once at ``step``."""

    def __init__(self, base: Path, step: str, monitor: str, hold: Path | None) -> None:
        once = base / "once"
        once.mkdir()
        env = {ENV_AT: f"runtime:{step}", ENV_ONCE_DIR: str(once)}
        if monitor == "python":
            env["PODVISOR_MONITOR"] = "python"
        if hold is not None:
            env[HOLD] = str(hold)
        self.rt = EmbeddedRuntime(base, env)
        self.under = RuntimeUnderTest("embedded", self.rt.client, "host", base / "t",
                                      embedded=self.rt)
        self.tag = str(random.randrange(10**8, 10**9))
        self.cmd: list[str] = ["sleep", self.tag]

    @property
    def client(self):  # type: ignore[no-untyped-def]
        return self.rt.client

    def crashes(self, call: Callable[[], object]) -> None:
        """``call`` fails because the runtime killed itself during it."""
        with pytest.raises(CriError) as info:
            call()
        assert self.rt.wait_died() == -signal.SIGKILL, self.rt.stderr()
        assert info.value.unavailable, info.value

    def restart(self) -> None:
        """A new runtime on the same root, without the hold (its own monitors run freely)."""
        self.rt.env.pop(HOLD, None)
        self.rt.start()

    def converge(self, name: str = "pod", cmd: Sequence[str] | None = None) -> str:
        """What the sync loop does for a pod that should run (actions.py, after a fresh
        read): the ready sandbox, else a new one; the running container, else the created
        one started, else a new one created and started."""
        client = self.client
        sconfig = self.under.sandbox_config(name)
        ready = [s for s in client.list_pod_sandbox(self._mine()) if s.state == pb.SANDBOX_READY]
        sid = ready[0].id if ready else client.run_pod_sandbox(sconfig)
        found = client.list_containers(pb.ContainerFilter(pod_sandbox_id=sid))
        running = [c.id for c in found if c.state == pb.CONTAINER_RUNNING]
        if running:
            return running[0]
        created = [c.id for c in found if c.state == pb.CONTAINER_CREATED]
        cid = created[0] if created else client.create_container(
            sid, self.under.container_config(name, cmd or self.cmd), sconfig)
        client.start_container(cid)
        return cid

    def observe(self) -> tuple[bool, str, int]:
        """(a ready sandbox exists, the container's state or "none", live processes)."""
        boxes = self.client.list_pod_sandbox(self._mine())
        containers = self.client.list_containers()
        state = STATE[containers[0].state] if containers else "none"
        assert len(containers) <= 1, containers
        return (any(s.state == pb.SANDBOX_READY for s in boxes), state, len(sleepers(self.tag)))

    def exactly_one(self, cid: str) -> None:
        assert self.client.container_status(cid).state == pb.CONTAINER_RUNNING
        assert len(sleepers(self.tag)) == 1
        assert len(self.client.list_containers()) == 1

    def remove_all(self, cid: str) -> None:
        self.client.stop_container(cid, 0)
        self.client.remove_container(cid)
        assert sleepers(self.tag) == []
        assert not list((self.rt.root / "containers").glob(f"{cid}*"))

    def _mine(self) -> pb.PodSandboxFilter:
        return pb.PodSandboxFilter(label_selector={TEST_LABEL: self.under.run_label})


@contextlib.contextmanager
def crashy(step: str, monitor: str = "c", hold: bool = False) -> Iterator[Crashy]:
    base = short_tmp("pvx1")
    fifo = base / "hold" if hold else None
    if fifo is not None:
        os.mkfifo(fifo)
    c = Crashy(base, step, monitor, fifo)
    (base / "t").mkdir()
    c.rt.start()
    try:
        yield c
    finally:
        try:
            if c.rt.proc is None:
                c.restart()
            cleanup(c.rt.client)
        finally:
            c.rt.stop()
            c.rt.client.close()
            for p in sleepers(c.tag):  # only after a failure: never leave them behind
                p.kill()
            shutil.rmtree(base, ignore_errors=True)


START_STEPS = {  # step -> what the new runtime holds before any retry
    "sandbox.before_record": (False, "none", 0),
    "sandbox.after_record": (True, "none", 0),
    "create.before_record": (True, "none", 0),
    "create.after_record": (True, "created", 0),
    "start.before_intent": (True, "created", 0),
    "start.after_intent": (True, "created", 0),  # the monitor never got the container
    "start.after_send": (True, "running", 1),    # the monitor started it: adopted
    "start.after_reply": (True, "running", 1),
}


def test_the_steps_tested_are_the_engines() -> None:
    stop = {"stop.after_signal", "stop.after_exit", "remove.after_stop", "remove.after_cgroups",
            "remove.after_record", "stop_sandbox.after_record",
            "remove_sandbox.after_containers", "remove_sandbox.after_record"}
    assert set(START_STEPS) | stop == set(STEPS)


@pytest.mark.parametrize("monitor", ["c", "python"])
@pytest.mark.parametrize("step", list(START_STEPS))
def test_runtime_killed_on_the_start_path(step: str, monitor: str) -> None:
    with crashy(step, monitor) as c:
        c.crashes(c.converge)
        c.restart()
        assert c.observe() == START_STEPS[step]
        cid = c.converge()
        c.exactly_one(cid)
        c.remove_all(cid)


def _hold_writer(fifo: Path) -> int:
    """Open the monitor's hold FIFO for writing once the monitor waits on it: it stays held
    (between its container's start and started.json) until this fd is closed."""
    def opened() -> int | None:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return None  # ENXIO: no reader yet
    fd = poll(opened, 30.0, "the monitor to hold before started.json")
    assert isinstance(fd, int)
    return fd


@pytest.mark.parametrize("monitor", ["c", "python"])
@pytest.mark.parametrize("when", ["released while the new runtime settles",
                                  "released before the new runtime starts",
                                  "monitor killed while held"])
def test_runtime_killed_after_the_fork_before_the_record(when: str, monitor: str) -> None:
    """The monitor has started the container and not yet written started.json when the
    runtime dies (and, in the first case, the new runtime has loaded its state meanwhile)."""
    with crashy("start.after_send", monitor, hold=True) as c:
        fifo = c.rt.base / "hold"
        c.crashes(c.converge)
        writer = _hold_writer(fifo)
        [proc] = sleepers(c.tag)  # running, in no record yet
        assert not list((c.rt.root / "containers").glob("*.started.json"))
        if when == "released while the new runtime settles":
            c.rt.env.pop(HOLD, None)
            c.rt.launch()
            poll(lambda: "runtime.start.settling" in c.rt.stderr(), 30.0,
                 "the new runtime to wait for the start in flight")
            os.close(writer)
            c.rt.wait_up()
            expected = (True, "running", 1)
        elif when == "released before the new runtime starts":
            os.close(writer)
            poll(lambda: list((c.rt.root / "containers").glob("*.started.json")), 30.0,
                 "started.json")
            c.restart()
            expected = (True, "running", 1)
        else:
            monitor_proc = proc.parent()
            assert monitor_proc is not None
            monitor_proc.kill()
            poll(lambda: not sleepers(c.tag), 30.0, "the container to die with its monitor")
            os.close(writer)
            c.restart()
            expected = (True, "created", 0)
        assert c.observe() == expected
        cid = c.converge()
        c.exactly_one(cid)
        if expected[1] == "running":
            assert [p.pid for p in sleepers(c.tag)] == [proc.pid]  # the one it adopted
        c.remove_all(cid)


def test_runtime_killed_while_stopping_a_container_that_ignores_sigterm() -> None:
    with crashy("stop.after_signal") as c:
        c.cmd = ["sh", "-c", f"trap '' TERM; exec sleep {c.tag}"]
        cid = c.converge()
        poll(lambda: sleepers(c.tag), 15.0, "the container to exec sleep")
        c.crashes(lambda: c.client.stop_container(cid, 30))
        c.restart()
        assert c.observe() == (True, "running", 1)  # SIGTERM ignored: still running, adopted
        c.client.stop_container(cid, 1)  # the retry: SIGKILL after 1 s
        assert c.observe() == (True, "exited", 0)
        c.remove_all(cid)


@pytest.mark.parametrize("step, call, after", [
    ("stop.after_exit", "stop", (True, "exited", 0)),
    ("remove.after_stop", "remove", (True, "exited", 0)),
    ("remove.after_cgroups", "remove", (True, "exited", 0)),
    ("remove.after_record", "remove", (True, "none", 0)),
    ("stop_sandbox.after_record", "stop_sandbox", (False, "exited", 0)),
    ("remove_sandbox.after_containers", "remove_sandbox", (True, "none", 0)),
    ("remove_sandbox.after_record", "remove_sandbox", (False, "none", 0)),
])
def test_runtime_killed_on_the_stop_path(step: str, call: str,
                                         after: tuple[bool, str, int]) -> None:
    with crashy(step) as c:
        cid = c.converge()
        c.exactly_one(cid)
        [sid] = [s.id for s in c.client.list_pod_sandbox()]
        calls: dict[str, Callable[[], object]] = {
            "stop": lambda: c.client.stop_container(cid, 0),
            "remove": lambda: c.client.remove_container(cid),
            "stop_sandbox": lambda: c.client.stop_pod_sandbox(sid),
            "remove_sandbox": lambda: c.client.remove_pod_sandbox(sid)}
        c.crashes(calls[call])
        c.restart()
        assert c.observe() == after
        calls[call]()  # the retry: idempotent
        if c.client.list_pod_sandbox():
            c.client.stop_pod_sandbox(sid)
            c.client.remove_pod_sandbox(sid)
        assert c.client.list_containers() == [] and c.client.list_pod_sandbox() == []
        assert sleepers(c.tag) == []
        assert not [p.name for p in (c.rt.root / "containers").iterdir()]
