"""PROCESS_LOG_* events from log files (services/ops/logevents.py) and supervisord's
tail_f_producer semantics (services/ops/logtail.py LogFollower), on real files."""

from __future__ import annotations

import os
from pathlib import Path

from podvisor.ipc.control import ProcessState
from podvisor.ipc.maps import DesiredPod
from podvisor.ipc.messages import ProcessStateChanged
from podvisor.services.ops.events import matches
from podvisor.services.ops.feeder import EventFeeder
from podvisor.services.ops.listener import LOG_POLL, Listener
from podvisor.services.ops.logevents import (
    LogSource,
    LogTap,
    agent_sources,
    container_sources,
    events_enabled,
    log_payload,
    wants_logs,
)
from podvisor.services.ops.logtail import TRUNCATED, LogFollower
from podvisor.services.ops.procs import Proc


def test_payload_is_supervisords() -> None:
    assert log_payload("app", "default.web", 42, "stderr", "oops\n") == (
        "processname:app groupname:default.web pid:42 channel:stderr\noops\n")


def test_types_nest_under_process_log() -> None:
    assert matches(["PROCESS_LOG"], "PROCESS_LOG_STDERR")
    assert matches(["EVENT"], "PROCESS_LOG_STDOUT")
    assert not matches(["PROCESS_STATE"], "PROCESS_LOG_STDOUT")
    assert not matches(["PROCESS_LOG_STDERR"], "PROCESS_LOG_STDOUT")
    assert wants_logs(["TICK_5", "PROCESS_LOG_STDOUT"]) and not wants_logs(["PROCESS_STATE"])


def _append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


def test_tap_container_channels_partials_and_new_files(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_bytes(b"T stdout F before the tap\n")
    src = LogSource("ns.pod", "c", 7, str(log), True, frozenset({"stdout", "stderr"}))
    tap = LogTap()
    tap.update([src])
    assert tap.poll() == []  # existing output makes no events: only what comes after
    _append(log, b"T stdout P hel\nT stderr F err 1\nT stdout F lo\nT stdout F half")
    assert tap.poll() == [  # in the order each channel's first complete line came
        ("PROCESS_LOG_STDERR", log_payload("c", "ns.pod", 7, "stderr", "err 1\n")),
        ("PROCESS_LOG_STDOUT", log_payload("c", "ns.pod", 7, "stdout", "hello\n"))]
    _append(log, b" done\n")
    assert tap.poll() == [("PROCESS_LOG_STDOUT",
                           log_payload("c", "ns.pod", 7, "stdout", "half done\n"))]
    # the container restarted: a new file, followed from its start
    new = tmp_path / "1.log"
    new.write_bytes(b"T stderr F first words\n")
    only_err = LogSource("ns.pod", "c", 8, str(new), True, frozenset({"stderr"}))
    tap.update([only_err])
    assert tap.poll() == [("PROCESS_LOG_STDERR",
                           log_payload("c", "ns.pod", 8, "stderr", "first words\n"))]
    _append(new, b"T stdout F not enabled\n")
    assert tap.poll() == []
    tap.update([])
    assert tap.tails == {}


def test_tap_plain_log_and_truncation(tmp_path: Path) -> None:
    log = tmp_path / "pleg.log"
    log.write_bytes(b"")
    (src,) = agent_sources({"pleg": {"stdout_events_enabled": True}, "syncloop": {}},
                           {"pleg": 99}, str(tmp_path))
    assert (src.path, src.channels, src.pid) == (str(log), frozenset({"stdout"}), 99)
    tap = LogTap()
    tap.update([src])
    _append(log, b'{"event": "a"}\n{"event": "b"}\n{"ev')
    assert tap.poll() == [("PROCESS_LOG_STDOUT", log_payload(
        "pleg", "agent", 99, "stdout", '{"event": "a"}\n{"event": "b"}\n'))]
    os.truncate(log, 0)
    _append(log, b"again\n")
    assert tap.poll() == [("PROCESS_LOG_STDOUT",
                           log_payload("pleg", "agent", 99, "stdout", "again\n"))]


def _proc(uid: str, logfile: str) -> Proc:
    return Proc(group="default.web", name="app", kind="container", state=ProcessState.RUNNING,
                pid=5, start=0, stop=0, exitstatus=0, spawnerr="", logfile=logfile,
                extra={"uid": uid})


def test_container_sources_from_annotations() -> None:
    def pod(notes: dict[str, str]) -> DesiredPod:
        return DesiredPod(pod={"metadata": {"annotations": notes}})

    desired = {"u1": pod({"ops.podvisor.io/stderr-events-enabled": "true"}),
               "u2": pod({}), "u3": pod({"ops.podvisor.io/stdout-events-enabled": "false"})}
    out = container_sources(desired, [_proc("u1", "/l/1"), _proc("u2", "/l/2"),
                                      _proc("u3", "/l/3")])
    assert [(s.path, s.channels) for s in out] == [("/l/1", frozenset({"stderr"}))]


def test_follower_head_truncation_and_rotation(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"a" * 2000)
    f = LogFollower(str(log), 1024)
    assert f.more() == b"a" * 1024 and f.more() == b""
    _append(log, b"new\n")
    assert f.more() == b"new\n"
    os.truncate(log, 0)
    assert f.more() is TRUNCATED
    _append(log, b"x\n")
    assert f.more() == b"x\n"
    os.rename(log, tmp_path / "x.log.1")
    log.write_bytes(b"rotated\n")
    assert f.more() == b"rotated\n"
    f.close()


def test_listener_hook_polls_logs_from_on_time(tmp_path: Path) -> None:
    """``Listener.on_time`` (the call its loop already makes) polls the enabled logs and asks to
    be called again within LOG_POLL; pids follow ``on_state``; EVENT covers PROCESS_LOG."""
    log = tmp_path / "pleg.log"
    log.write_bytes(b"old\n")
    feeder = EventFeeder("l")
    listener = Listener(feeder, ["EVENT"])
    assert listener.on_time(1000.0) == 1005.0  # no logs enabled: the next tick
    listener.enable_logs({"pleg": {"stdout_events_enabled": True}}, str(tmp_path), {"pleg": 5})
    assert listener.on_time(1000.1) == 1000.1 + LOG_POLL
    listener.on_state(ProcessStateChanged(name="pleg", from_state="STARTING",
                                          to_state="RUNNING", pid=6, restarts=1))
    _append(log, b"new\n")
    listener.on_time(1000.3)
    logs = [e for e in feeder.queue if e.name.startswith("PROCESS_LOG")]
    assert [(e.name, e.payload) for e in logs] == [
        ("PROCESS_LOG_STDOUT", b"processname:pleg groupname:agent pid:6 channel:stdout\nnew\n")]


def test_events_enabled_as_get_all_config_info_reports_them() -> None:
    """``getAllConfigInfo``'s stdout/stderr_events_enabled: a subsystem's spec, a container's
    pod annotations."""
    specs = {"pleg": {"stdout_events_enabled": True}}
    pleg = Proc(group="agent", name="pleg", kind="agent", state=ProcessState.RUNNING, pid=5,
                start=0, stop=0, exitstatus=0, spawnerr="", logfile="")
    desired = {"u1": DesiredPod(pod={"metadata": {"annotations": {
        "ops.podvisor.io/stderr-events-enabled": "true"}}})}
    assert events_enabled(pleg, specs, desired) == (True, False)
    assert events_enabled(_proc("u1", "/l/1"), specs, desired) == (False, True)
    assert events_enabled(_proc("gone", "/l/2"), specs, desired) == (False, False)
