"""The control protocol's types and codec (``podvisor.ipc.control``), without an agent: the wire
forms are exactly the documented ones, they read back, and what a reader does not know reads as
the documented fallback. The client against a real agent: tests/cli/test_ctl.py."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import msgpack
import pytest
import zmq

from podvisor.ipc.control import (
    AGENT_FAULTS,
    AgentNotRunning,
    ControlClient,
    ControlFault,
    Fault,
    LastExit,
    ProcessRow,
    ProcessState,
    decode_request,
    encode_request,
    status_rows,
)

ROW = {"name": "pleg", "state": "RUNNING", "pid": 4242, "restarts": 1, "uptime": 12.5,
       "heartbeatAge": 0.4, "heartbeatLate": False, "since": 1795312611.0,
       "module": "podvisor.services.pleg.main", "enabled": True, "reason": "ready",
       "lastExit": {"code": None, "signal": 9, "signame": "SIGKILL",
                    "reason": "killed by SIGKILL", "time": 1795312610.9, "ranFor": 3.2}}


def test_a_row_reads_back_to_the_same_wire_form_key_for_key() -> None:
    row = ProcessRow.from_wire(ROW)
    assert row.state is ProcessState.RUNNING and row.last_exit is not None
    assert row.last_exit.signame == "SIGKILL"
    assert row.to_wire() == ROW and list(row.to_wire()) == list(ROW)


def test_a_last_exit_rounds_its_run_time_and_names_its_signal() -> None:
    wire = LastExit(None, int(signal.SIGTERM), "stopped", 10.0, 1.23456).to_wire()
    assert wire == {"code": None, "signal": 15, "signame": "SIGTERM", "reason": "stopped",
                    "time": 10.0, "ranFor": 1.235}
    assert LastExit(None, 250, "?", 0.0, 0.0).signame == "250"  # no such signal: the number


def test_what_a_reader_does_not_know_takes_the_fallback() -> None:
    row = ProcessRow.from_wire({"name": "x", "state": "DANCING", "pid": "7", "uptime": True})
    assert (row.state, row.pid, row.uptime, row.last_exit) == (ProcessState.UNKNOWN, None,
                                                                None, None)
    assert status_rows({"processes": [ROW, "junk"]}) == [ProcessRow.from_wire(ROW)]
    assert status_rows(None) == [] and status_rows({"processes": 3}) == []


def test_states_carry_supervisords_names_and_numbers() -> None:
    assert [(s.name, int(s)) for s in ProcessState] == [
        ("STOPPED", 0), ("STARTING", 10), ("RUNNING", 20), ("BACKOFF", 30), ("STOPPING", 40),
        ("EXITED", 100), ("FATAL", 200), ("UNKNOWN", 1000)]


def test_a_fault_reads_back_and_an_unknown_code_is_failed() -> None:
    wire = ControlFault(Fault.BAD_NAME, "no process named 'x'").to_wire()
    assert wire == {"code": 10, "name": "BAD_NAME", "message": "no process named 'x'"}
    back = ControlFault.from_wire(wire)
    assert (back.fault, back.message) == (Fault.BAD_NAME, "no process named 'x'")
    assert ControlFault.from_wire({"code": 999, "message": "m"}).fault is Fault.FAILED
    assert ControlFault.from_wire(None).fault is Fault.FAILED
    assert {int(f) for f in AGENT_FAULTS} == {100, 110}


def test_a_request_reads_back_and_a_bad_one_is_incorrect_parameters() -> None:
    assert decode_request(encode_request("kill", {"name": "a", "signal": 9})) == (
        "kill", {"name": "a", "signal": 9})
    for data in (b"\xc1", msgpack.packb([1]), msgpack.packb({"command": "x", "args": 3}),
                 b"\x00" * (64 * 1024 + 1)):
        with pytest.raises(ControlFault) as err:
            decode_request(data)
        assert err.value.fault is Fault.INCORRECT_PARAMETERS


def test_no_socket_is_agent_not_running_at_once(tmp_path: Path) -> None:
    with pytest.raises(AgentNotRunning, match="not running"):
        ControlClient(f"ipc://{tmp_path}/control.sock").call("status")


def _answer_once(sock: zmq.Socket[bytes], reply: bytes) -> None:
    frames = sock.recv_multipart()
    sock.send_multipart([*frames[:-1], reply])


@pytest.mark.parametrize(("reply", "fault"), [
    (msgpack.packb({"ok": False, "fault": {"code": 60, "name": "ALREADY_STARTED",
                                           "message": "a is RUNNING"}}), Fault.ALREADY_STARTED),
    (msgpack.packb([1, 2]), Fault.FAILED),
    (b"\xc1", Fault.FAILED),
])
def test_the_client_raises_the_fault_a_reply_carries(tmp_path: Path, reply: bytes,
                                                     fault: Fault) -> None:
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    endpoint = f"ipc://{tmp_path}/control.sock"
    router = zctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    answer = threading.Thread(target=_answer_once, args=(router, reply))
    answer.start()
    try:
        with pytest.raises(ControlFault) as err:
            ControlClient(endpoint, timeout=10.0, zctx=zctx).call("start", name="a")
        assert err.value.fault is fault
    finally:
        answer.join(10)
        router.close(linger=0)
        zctx.term()
