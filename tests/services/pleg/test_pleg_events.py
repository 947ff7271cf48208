"""generate_events: every (old, new) state pair of the KUBELET.md table, and whole snapshots."""

from __future__ import annotations

import itertools

import pytest

from podvisor.services.pleg.events import (
    ContainerState,
    EventType,
    PodEvent,
    container_events,
    generate_events,
    state_of_container,
    state_of_sandbox,
)

R, X, U, N = (ContainerState.RUNNING, ContainerState.EXITED, ContainerState.UNKNOWN,
              ContainerState.NON_EXISTENT)
STARTED, DIED, REMOVED, CHANGED = (EventType.CONTAINER_STARTED, EventType.CONTAINER_DIED,
                                   EventType.CONTAINER_REMOVED, EventType.CONTAINER_CHANGED)

# (old, new) -> event types, for all 16 pairs (kubelet generic.go generateEvents).
TABLE = {
    (R, R): [], (X, X): [], (U, U): [], (N, N): [],
    (N, R): [STARTED], (X, R): [STARTED], (U, R): [STARTED],
    (N, X): [DIED], (R, X): [DIED], (U, X): [DIED],
    (N, U): [CHANGED], (R, U): [CHANGED], (X, U): [CHANGED],
    (X, N): [REMOVED],
    (R, N): [DIED, REMOVED],
    (U, N): [DIED, REMOVED],
}


def test_table_covers_every_pair() -> None:
    assert set(TABLE) == set(itertools.product(ContainerState, repeat=2))


@pytest.mark.parametrize(("old", "new"), sorted(TABLE, key=lambda p: (p[0].value, p[1].value)))
def test_container_events(old: ContainerState, new: ContainerState) -> None:
    got = container_events("pod", "c1", old, new)
    assert got == [PodEvent("pod", t, "c1") for t in TABLE[(old, new)]]


@pytest.mark.parametrize(("old", "new"), sorted(TABLE, key=lambda p: (p[0].value, p[1].value)))
def test_generate_events_one_container(old: ContainerState, new: ContainerState) -> None:
    before = {} if old == N else {"pod": {"c1": old}}
    after = {} if new == N else {"pod": {"c1": new}}
    assert generate_events(before, after) == [PodEvent("pod", t, "c1") for t in TABLE[(old, new)]]


def test_empty_snapshots() -> None:
    assert generate_events({}, {}) == []


def test_first_relist_reports_running_as_started_never_died() -> None:
    new = {"p": {"sb": R, "c-run": R, "c-old": X, "c-new": U}}
    got = generate_events({}, new)
    assert got == [PodEvent("p", CHANGED, "c-new"), PodEvent("p", DIED, "c-old"),
                   PodEvent("p", STARTED, "c-run"), PodEvent("p", STARTED, "sb")]
    assert not [e for e in got if e.type == DIED and e.container_id in ("c-run", "sb")]


def test_pod_vanishing_removes_all_its_containers() -> None:
    old = {"p": {"sb": R, "a": R, "b": X}}
    assert generate_events(old, {}) == [
        PodEvent("p", DIED, "a"), PodEvent("p", REMOVED, "a"),
        PodEvent("p", REMOVED, "b"),
        PodEvent("p", DIED, "sb"), PodEvent("p", REMOVED, "sb"),
    ]


def test_several_pods_are_independent_and_ordered() -> None:
    old = {"b": {"x": R}, "a": {"y": R, "z": R}}
    new = {"b": {"x": R}, "a": {"y": X, "z": R}, "c": {"w": R}}
    assert generate_events(old, new) == [PodEvent("a", DIED, "y"), PodEvent("c", STARTED, "w")]


def test_unchanged_snapshot_is_quiet() -> None:
    snap = {"p": {"a": R, "b": X, "c": U}}
    assert generate_events(snap, dict(snap)) == []


def test_restart_within_a_pod_is_died_then_new_started() -> None:
    old = {"p": {"c1": R}}
    new = {"p": {"c1": X, "c2": R}}
    assert generate_events(old, new) == [PodEvent("p", DIED, "c1"), PodEvent("p", STARTED, "c2")]


@pytest.mark.parametrize(("cri", "state"), [
    ("CONTAINER_RUNNING", R), ("CONTAINER_EXITED", X), ("CONTAINER_CREATED", U),
    ("CONTAINER_UNKNOWN", U), ("bogus", U),
])
def test_state_of_container(cri: str, state: ContainerState) -> None:
    assert state_of_container(cri) == state


@pytest.mark.parametrize(("cri", "state"), [("SANDBOX_READY", R), ("SANDBOX_NOTREADY", X)])
def test_state_of_sandbox(cri: str, state: ContainerState) -> None:
    assert state_of_sandbox(cri) == state
