"""The state table and change_state()."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from podvisor.ipc.control import ProcessState
from podvisor.supervisor.states import (
    TRANSITIONS,
    InvalidTransition,
    StateChange,
    change_state,
)

S = ProcessState


@dataclass
class Rec:
    state: ProcessState = S.STOPPED
    restarts: int = 0
    state_since: float = 0.0

    @property
    def name(self) -> str:
        return "p"

    @property
    def pid(self) -> int | None:
        return 42

    def exit_fields(self) -> tuple[int | None, int | None, str]:
        return 1, None, "exit code 1"


def test_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(ProcessState)


@pytest.mark.parametrize("frm", list(ProcessState))
@pytest.mark.parametrize("to", list(ProcessState))
def test_change_state_follows_the_table(frm: ProcessState, to: ProcessState) -> None:
    rec = Rec(state=frm)
    seen: list[StateChange] = []
    if to in TRANSITIONS[frm]:
        change = change_state(rec, to, seen.append, now=5.0, wall=1000.0)
        assert rec.state == to and rec.state_since == 5.0
        assert seen == [change]
        assert (change.from_state, change.to_state, change.pid) == (frm, to, 42)
        assert (change.exit_code, change.reason, change.ts) == (1, "exit code 1", 1000.0)
    else:
        with pytest.raises(InvalidTransition):
            change_state(rec, to, seen.append, now=5.0, wall=1000.0)
        assert rec.state == frm and seen == []


def test_key_edges() -> None:
    assert S.RUNNING in TRANSITIONS[S.STARTING]
    assert S.STARTING in TRANSITIONS[S.BACKOFF]
    assert S.STARTING in TRANSITIONS[S.FATAL]  # operator start
    assert S.RUNNING not in TRANSITIONS[S.STOPPED]
    assert S.STOPPED not in TRANSITIONS[S.RUNNING]  # must pass through STOPPING
