"""Pod worker states and their allowed transitions (dependency-free)."""

from __future__ import annotations

from enum import StrEnum


class WorkerState(StrEnum):
    SYNCING = "syncing"
    TERMINATING = "terminating"
    TERMINATED = "terminated"


TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    WorkerState.SYNCING: frozenset({WorkerState.TERMINATING}),
    WorkerState.TERMINATING: frozenset({WorkerState.TERMINATED}),
    WorkerState.TERMINATED: frozenset(),
}


class InvalidTransition(ValueError):
    pass


def check_transition(old: WorkerState, new: WorkerState) -> None:
    if new is not old and new not in TRANSITIONS[old]:
        raise InvalidTransition(f"pod worker cannot go from {old} to {new}")
