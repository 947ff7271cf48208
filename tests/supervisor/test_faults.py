"""The supervisor's table of faults in force (supervisor/faults.py, issue 28), without an agent:
it applies, expires and clears faults, keeps run/faults/faults.json, and records each start and
end as an event."""

from __future__ import annotations

import signal
from pathlib import Path

from podvisor.common.logs import MemoryLogger
from podvisor.ipc.clock import FakeClock
from podvisor.ipc.faults import FaultSpec, read_faults
from podvisor.supervisor.eventstore import EventStore
from podvisor.supervisor.faults import FaultTable


class _Proc:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.alive = True


class _Sup:
    """The two things the fault table asks of the supervisor."""

    def __init__(self) -> None:
        self.procs = {"pleg": _Proc(42)}
        self.signals: list[tuple[str, int]] = []

    def kill(self, name: str, sig: int) -> _Proc:
        self.signals.append((name, int(sig)))
        return self.procs[name]


def test_the_table_applies_expires_clears_and_records_each_start_and_end(
        tmp_path: Path) -> None:
    clock = FakeClock(50.0)
    sup = _Sup()
    events = EventStore(None, clock=clock.monotonic)
    path = tmp_path / "run" / "faults" / "faults.json"
    table = FaultTable(sup, path, events, MemoryLogger(), clock.monotonic,  # type: ignore[arg-type]
                       clock.wall)
    assert read_faults(path) == ()
    stop = table.inject(FaultSpec("stop", "pleg", duration=5.0))
    bus = table.inject(FaultSpec("bus", "pleg", action="drop"))
    table.inject(FaultSpec("kill", "pleg", signal="TERM"))
    assert [f.id for f in read_faults(path)] == ["f1", "f2"]  # the kill was instant
    assert sup.signals == [("pleg", signal.SIGSTOP), ("pleg", signal.SIGTERM)]
    assert table.next_expiry() == 55.0 and stop.expires == stop.started + 5.0
    clock.advance(5.0)
    assert [f.id for f in table.expire()] == ["f1"]
    assert sup.signals[-1] == ("pleg", signal.SIGCONT)
    assert [f.id for f in read_faults(path)] == [bus.id]
    assert [f.id for f in table.clear()] == ["f2"] and read_faults(path) == ()
    reasons = [(e["reason"], e["involvedObject"]["name"])
               for e in events.event_list()["items"]]
    assert sorted(reasons) == sorted([("FaultInjected", "f1"), ("FaultInjected", "f2"),
                                      ("FaultInjected", "f3"), ("FaultCleared", "f3"),
                                      ("FaultCleared", "f1"), ("FaultCleared", "f2")])
    messages = [e["message"] for e in events.event_list()["items"]]
    assert "f1 stop pleg: SIGSTOP: expired after 5.0s" in messages
    assert "f2 bus pleg: drop both: cleared after 5.0s" in messages
