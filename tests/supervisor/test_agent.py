"""The supervisor with real processes and real sockets (fault injection included)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
import zmq

from podvisor.ipc.bus import Publisher
from podvisor.services.events import model as ev
from tests.conftest import process_gone

IDLE = {"module": "svc_idle", "heartbeatTimeout": "1500ms", "stopTimeout": "2s"}


def _pids(agent_handle: Any) -> dict[str, int | None]:
    return {name: row["pid"] for name, row in agent_handle.status().items()}


def test_kill_9_restarts_only_that_process(agent: Any) -> None:
    a = agent({"one": IDLE, "two": IDLE, "three": IDLE})
    before = {n: a.wait_state(n, "RUNNING")["pid"] for n in ("one", "two", "three")}
    os.kill(before["two"], signal.SIGKILL)
    row = a.wait_state("two", "RUNNING", where=lambda r: r["pid"] != before["two"])
    assert row["restarts"] == 1
    assert row["lastExit"]["signal"] == signal.SIGKILL
    assert row["lastExit"]["reason"] == "killed by SIGKILL"
    after = _pids(a)
    assert after["one"] == before["one"] and after["three"] == before["three"]


def test_sigstop_is_detected_by_missing_heartbeats_and_replaced(agent: Any) -> None:
    a = agent({"frozen": IDLE, "other": IDLE})
    pid = a.wait_state("frozen", "RUNNING")["pid"]
    other = a.wait_state("other", "RUNNING")["pid"]
    os.kill(pid, signal.SIGSTOP)
    row = a.wait_state("frozen", "RUNNING", where=lambda r: r["pid"] != pid)
    assert "no heartbeat" in row["lastExit"]["reason"]
    assert process_gone(pid)
    assert a.state("other")["pid"] == other


def test_beats_through_the_shared_file_keep_a_process_running(agent: Any) -> None:
    """Periodic beats are a write into `run/beat-<name>` (no socket message): a process that
    only beats that way stays RUNNING well past its heartbeatTimeout."""
    a = agent({"steady": {**IDLE, "heartbeatTimeout": "1s"}})
    pid = a.wait_state("steady", "RUNNING")["pid"]
    row = a.wait_state("steady", "RUNNING", where=lambda r: (r["uptime"] or 0) > 3)
    assert row["pid"] == pid and row["restarts"] == 0
    raw = (a.paths.run_dir / "beat-steady").read_bytes()
    assert int.from_bytes(raw[:8], "little") == pid and int.from_bytes(raw[8:], "little") > 3


def test_crash_at_start_goes_fatal_and_others_keep_running(agent: Any) -> None:
    spec = {"module": "svc_crash", "intensity": 3, "intensityPeriod": "1m",
            "backoffBase": "10ms", "backoffCap": "50ms"}
    a = agent({"crasher": spec, "steady": IDLE})
    steady = a.wait_state("steady", "RUNNING")["pid"]
    row = a.wait_state("crasher", "FATAL")
    assert row["restarts"] == 3
    assert row["lastExit"]["code"] == 1
    assert "intensity 3" in row["reason"]
    out = a.ctl("status", "--json")
    assert out.returncode == 0, out.stderr
    rows = {p["name"]: p for p in json.loads(out.stdout)["processes"]}
    assert rows["crasher"]["state"] == "FATAL"
    assert rows["crasher"]["lastExit"]["reason"] == "exit code 1"
    assert rows["steady"]["pid"] == steady and rows["steady"]["state"] == "RUNNING"
    log = (a.paths.logs_dir / "crasher.log").read_text()
    events = [json.loads(line) for line in log.splitlines()]
    crashed = [e for e in events if e["event"] == "child.crashed"]
    assert crashed and "boom at start" in crashed[0]["exc"]
    assert crashed[0]["subsystem"] == "crasher"


def test_normal_return_is_rerun_after_period(agent: Any) -> None:
    a = agent({"job": {"module": "svc_return", "period": "100ms"}})
    row = a.wait_state("job", "EXITED", where=lambda r: r["restarts"] >= 2)
    assert row["lastExit"]["reason"] == "exited normally"


def test_sigterm_stops_every_child_and_exits_0(agent: Any, wait_for: Any) -> None:
    a = agent({"one": IDLE, "two": IDLE, "stubborn": {**IDLE, "module": "svc_stubborn",
                                                        "stopTimeout": "300ms"}})
    pids = [a.wait_state(n, "RUNNING")["pid"] for n in ("one", "two", "stubborn")]
    assert a.stop() == 0
    assert all(not psutil.pid_exists(p) for p in pids)
    log = [json.loads(line) for line in (a.paths.logs_dir / "supervisor.log").read_text()
           .splitlines()]
    stopping = [e["process"] for e in log if e["event"] == "process.stopping"]
    assert stopping == ["stubborn", "two", "one"]  # reverse start order
    kills = [e["process"] for e in log if e["event"] == "process.kill"]
    assert kills == ["stubborn"]


def test_agent_death_takes_children_down(agent: Any, wait_for: Any) -> None:
    a = agent({"one": IDLE})
    pid = a.wait_state("one", "RUNNING")["pid"]
    a.proc.kill()
    a.proc.wait()
    wait_for(lambda: process_gone(pid), message="orphan exit")


def test_sighup_reload_applies_changes(agent: Any, wait_for: Any) -> None:
    a = agent({"keep": IDLE, "drop": IDLE, "off": {**IDLE, "enabled": False}})
    keep = a.wait_state("keep", "RUNNING")["pid"]
    drop = a.wait_state("drop", "RUNNING")["pid"]
    assert a.state("off")["state"] == "STOPPED"
    cfg = a.config
    cfg["supervision"]["processes"] = {
        "keep": {**IDLE, "period": "3s"},
        "off": IDLE,
        "new": IDLE,
    }
    a.write_config(cfg)
    a.proc.send_signal(signal.SIGHUP)
    a.wait_state("new", "RUNNING")
    a.wait_state("off", "RUNNING")
    wait_for(lambda: "drop" not in a.status(), message="drop removed")
    assert process_gone(drop)
    assert a.state("keep")["pid"] == keep
    log = (a.paths.logs_dir / "supervisor.log").read_text()
    reloaded = [json.loads(x) for x in log.splitlines() if '"agent.reloaded"' in x]
    changes = reloaded[-1]["changes"]
    assert "keep: period 1.0 -> 3.0" in changes and "new: added" in changes


def test_bad_reload_keeps_old_config(agent: Any) -> None:
    a = agent({"keep": IDLE})
    a.wait_state("keep", "RUNNING")
    Path(a.config_path).write_text("supervision: {bogusKey: 1}\n")
    out = a.ctl("reload")
    assert out.returncode == 1
    assert "CANT_REREAD" in out.stderr and "supervision.bogusKey" in out.stderr
    assert a.state("keep")["state"] == "RUNNING"


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"bogus": 1}, "bogus"),
        ({"syncFrequency": "ten seconds"}, "syncFrequency"),
        ({"readOnlyPort": "x"}, "readOnlyPort"),
        ({"runtimeEndpoint": "tcp://1.2.3.4"}, "runtimeEndpoint"),
        ({"supervision": {"processes": {"p": {"period": "5 parsecs", "module": "m"}}}},
         "supervision.processes.p.period"),
        ({"supervision": {"processes": {"p": {"period": "1s"}}}}, "supervision.processes.p.module"),
    ],
)
def test_config_errors_exit_non_zero_naming_the_key(
    agent: Any, config: dict[str, Any], key: str
) -> None:
    a = agent(config=config, wait=False)
    assert a.proc.wait(30) == 2
    assert f"'{key}'" in a.stderr()


def test_flags_override_the_file(agent: Any) -> None:
    a = agent({"one": IDLE}, extra_args=("--node-name", "from-flag", "--read-only-port", "0",
                                         "--process", "one.period=7s"))
    effective = json.loads(a.paths.config_json.read_text())
    assert effective["nodeName"] == "from-flag"
    assert effective["supervision"]["processes"]["one"]["period"] == "7.0s"
    assert yaml.safe_load(a.config_path.read_text())["nodeName"] == "test-node"
    assert oct(a.paths.run_dir.stat().st_mode & 0o777) == "0o700"


def test_second_agent_on_same_root_is_refused(agent: Any) -> None:
    a = agent({"one": IDLE})
    b = agent(config={**a.config}, wait=False)
    assert b.proc.wait(30) == 1
    assert "another agent" in b.stderr()


def test_exec_spawn_method_also_restarts(agent: Any) -> None:
    a = agent({"one": IDLE}, extra_args=("--supervision-spawn-method", "exec"))
    pid = a.wait_state("one", "RUNNING")["pid"]
    assert "podvisor.supervisor.child" in " ".join(psutil.Process(pid).cmdline())
    os.kill(pid, signal.SIGKILL)
    a.wait_state("one", "RUNNING", where=lambda r: r["pid"] != pid)


def test_config_keys_of_built_subsystems_are_not_reported_at_start(agent: Any) -> None:
    """Every config key has its subsystem now (log rotation, image GC, the API server and the
    main port were the last): setting one draws no "not used" warning at start."""
    a = agent({"one": IDLE}, extra_args=("--container-log-max-files", "9"))
    a.wait_state("one", "RUNNING")
    events = [json.loads(line) for line in
              (a.paths.logs_dir / "supervisor.log").read_text().splitlines()]
    assert [e for e in events if e["event"] == "config.key_not_used"] == []


def test_ctrl_c_to_the_process_group_stops_children_in_reverse_order(agent: Any) -> None:
    """A terminal's Ctrl-C sends SIGINT to every process of the foreground group: only the
    supervisor acts on it, and stops its children one by one, last started first."""
    a = agent({"one": IDLE, "two": IDLE, "three": IDLE})
    for name in ("one", "two", "three"):
        a.wait_state(name, "RUNNING")
    os.killpg(os.getpgid(a.proc.pid), signal.SIGINT)
    assert a.proc.wait(30) == 0
    events = [json.loads(line) for line in
              (a.paths.logs_dir / "supervisor.log").read_text().splitlines()]
    order = [(e["event"], e["process"]) for e in events
             if e["event"] in ("process.stopping", "process.exited")]
    assert order == [("process.stopping", "three"), ("process.exited", "three"),
                     ("process.stopping", "two"), ("process.exited", "two"),
                     ("process.stopping", "one"), ("process.exited", "one")]


def test_a_burst_of_events_is_kept_whole(agent: Any, wait_for: Any) -> None:
    """The loop reads `events.*` in batches during a burst (EVENTS_COALESCE): every event of
    a burst still reaches the store, `events` and `state/events.jsonl`."""
    a = agent({"one": IDLE})
    a.wait_state("one", "RUNNING")
    zctx = zmq.Context()
    pub = Publisher(zctx, a.paths, "test")

    def sent(message: str) -> Any:
        return ev.new_event(ev.NORMAL, "Started", message,
                            ev.pod_object("p", "default", "u1"), "test", 100.0)

    def messages() -> set[str]:
        return {e["message"] for e in a.call("events")["items"]}

    try:
        # the agent's subscription reaches this publisher some time after it connects
        wait_for(lambda: "probe" in messages(), pump=lambda: pub.publish(sent("probe")))
        for i in range(300):
            pub.publish(sent(f"m{i}"))
        want = {f"m{i}" for i in range(300)}
        wait_for(lambda: want <= messages(), message="every event of the burst")
        path = a.paths.state_dir / "events.jsonl"
        wait_for(lambda: path.exists() and want <= {
            json.loads(line)["message"] for line in path.read_text().splitlines()},
            message="the burst on disk")
    finally:
        pub.close()
        zctx.term()
