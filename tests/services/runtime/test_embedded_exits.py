"""Embedded runtime internals, with real processes: exit notes from monitors (the fast path to
CONTAINER_STOPPED), the pidfd fallback, and spares handed straight to the runtime."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.runtime.engine import Engine
from podvisor.services.runtime.model import ExitInfo
from podvisor.services.runtime.monitor import send_exit_note
from podvisor.services.runtime.watcher import ExitWatcher, bind_exit_socket
from tests.services.conftest import poll


class _Log:
    def info(self, event: str, **fields: Any) -> None: ...
    def warning(self, event: str, **fields: Any) -> None: ...
    def error(self, event: str, **fields: Any) -> None: ...


@pytest.fixture
def root() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="pvex", dir="/tmp"))  # short: unix socket path limit
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def engine(root: Path) -> Iterator[Engine]:
    eng = Engine(root / "root", _Log())
    eng.start()
    yield eng
    for sb in eng.sandboxes():
        eng.stop_sandbox(sb.id)
        eng.remove_sandbox(sb.id)
    eng.close()


def _sandbox(eng: Engine, root: Path, name: str) -> str:
    return eng.run_sandbox(pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace="n", uid=f"uid-{name}"),
        log_directory=str(root / "logs" / name)), "")


def _container(eng: Engine, sandbox_id: str, name: str, cmd: list[str]) -> str:
    return eng.create_container(sandbox_id, pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=name), image=pb.ImageSpec(image="host"),
        command=cmd, log_path=f"{name}.log"))


def test_watcher_delivers_exit_notes_and_ignores_garbage(root: Path) -> None:
    path = root / "exits.sock"
    sock = bind_exit_socket(path)
    assert sock is not None
    assert path.stat().st_mode & 0o777 == 0o600
    notes: list[tuple[str, ExitInfo]] = []
    watcher = ExitWatcher(lambda key: None, lambda key, info: notes.append((key, info)))
    watcher.listen(sock)
    watcher.start()
    try:
        send_exit_note(str(path), {"garbage": True})
        send_exit_note(str(path), {"id": "c1", "exit_code": 3, "finished_at": 42,
                                   "reason": "Error", "message": ""})
        poll(lambda: notes, message="exit note")
        assert notes == [("c1", ExitInfo(3, 42, "Error", ""))]
        send_exit_note(str(root / "nobody.sock"), {"id": "x"})  # no listener: no error
    finally:
        watcher.stop()
        watcher.stop()  # idempotent


def test_exit_socket_path_too_long_disables_notes(root: Path) -> None:
    assert bind_exit_socket(root / ("x" * 120) / "exits.sock") is None


def test_exit_note_alone_records_the_exit_as_on_disk(engine: Engine, root: Path) -> None:
    """With the pidfd fallback switched off, the monitor's note alone records the exit, with
    exactly what exit.json holds; the log is complete when the exit is known."""
    engine._watcher.watch = lambda *a: None  # type: ignore[method-assign]
    sub = engine.events.subscribe()
    assert sub is not None
    sid = _sandbox(engine, root, "note")
    cid = _container(engine, sid, "c", ["sh", "-c", "echo last words; exit 5"])
    engine.start_container(cid)
    poll(lambda: engine.container(cid).exited, message="exit recorded from the note")
    c = engine.container(cid)
    assert c.exited is not None and c.exited.exit_code == 5 and c.exited.reason == "Error"
    on_disk = json.loads(Path(engine.store.exit_path(cid)).read_text())
    assert on_disk["finished_at"] == c.exited.finished_at
    assert on_disk["exit_code"] == 5
    assert "last words" in Path(c.log_path).read_text()
    kinds = []
    while (event := sub.get(timeout=0)) is not None:
        kinds.append(event.container_event_type)
    assert kinds == [pb.CONTAINER_CREATED_EVENT, pb.CONTAINER_STARTED_EVENT,
                     pb.CONTAINER_STOPPED_EVENT]


def test_instant_exits_keep_started_before_stopped(engine: Engine, root: Path) -> None:
    """A note may beat the start's reply: the STOPPED event still follows STARTED."""
    sub = engine.events.subscribe()
    assert sub is not None
    sid = _sandbox(engine, root, "instant")
    cids = [_container(engine, sid, f"c{i}", ["true"]) for i in range(6)]
    for cid in cids:
        engine.start_container(cid)
    poll(lambda: all(engine.container(cid).exited for cid in cids), message="all exits")
    seen: dict[str, list[int]] = {cid: [] for cid in cids}
    while (event := sub.get(timeout=0)) is not None:
        seen[event.container_id].append(event.container_event_type)
    for cid in cids:
        assert seen[cid] == [pb.CONTAINER_CREATED_EVENT, pb.CONTAINER_STARTED_EVENT,
                             pb.CONTAINER_STOPPED_EVENT]
        c = engine.container(cid)
        assert c.exited is not None and c.exited.exit_code == 0
        assert c.started is not None


def test_pidfd_fallback_without_notes(engine: Engine, root: Path) -> None:
    engine._spawner.notify = ""  # monitors send no note: the pidfd of the monitor tells
    sid = _sandbox(engine, root, "fallback")
    cid = _container(engine, sid, "c", ["sleep", "1000"])
    engine.start_container(cid)
    st = engine.container(cid).started
    assert st is not None
    os.kill(st.pid, signal.SIGKILL)
    poll(lambda: engine.container(cid).exited, message="exit via the monitor's pidfd")
    exited = engine.container(cid).exited
    assert exited is not None and exited.exit_code == 137


def test_start_survives_a_killed_zygote_and_spares_exit_with_the_runtime(root: Path) -> None:
    engine = Engine(root / "root", _Log())
    engine.start()
    started = []
    try:
        sid = _sandbox(engine, root, "zygote")
        first = _container(engine, sid, "a", ["sleep", "1000"])
        engine.start_container(first)
        started.append(first)
        proc = engine._spawner._proc
        assert proc is not None
        zygote = psutil.Process(proc.pid)
        monitor = engine.container(first).started
        assert monitor is not None
        spares = poll(lambda: [p for p in zygote.children() if p.pid != monitor.monitor_pid],
                      message="a spare forked")
        zygote.kill()
        second = _container(engine, sid, "b", ["sleep", "1000"])
        engine.start_container(second)
        started.append(second)
        used = engine.container(second).started
        assert used is not None
        spares = [p for p in spares if p.pid != used.monitor_pid]  # one became b's monitor
    finally:
        engine.close()  # the runtime's ends of the spares' sockets close: unused spares exit

    def gone(p: psutil.Process) -> bool:
        try:
            return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
    poll(lambda: all(gone(p) for p in spares), message="spares to exit")
    for cid in started:
        st = engine.container(cid).started
        assert st is not None and psutil.pid_exists(st.pid)  # containers live on
        os.killpg(st.pid, signal.SIGKILL)


def test_concurrent_starts_beyond_the_spares(engine: Engine, root: Path) -> None:
    """More simultaneous starts than spares: the extra ones ask the zygote for a fork now."""
    sid = _sandbox(engine, root, "burst")
    cids = [_container(engine, sid, f"c{i}", ["sleep", "1000"]) for i in range(6)]
    errors: list[BaseException] = []

    def start(cid: str) -> None:
        try:
            engine.start_container(cid)
        except BaseException as err:  # reported below
            errors.append(err)
    threads = [threading.Thread(target=start, args=(cid,)) for cid in cids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert all(engine.container(cid).started is not None for cid in cids)
