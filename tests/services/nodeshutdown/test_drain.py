"""The drain's pure decisions (``services/nodeshutdown/drain.py``): grouping by priority, the
order of the groups, each pod's grace, a group ending when its pods are terminated or its
seconds ran out, InhibitDelayMaxSec as a cap, and the FailPod republished until taken."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from podvisor.common.shutdownkeys import SYSTEM_CRITICAL_PRIORITY, ShutdownGroup
from podvisor.ipc.maps import NODE_SHUTDOWN_MESSAGE, NODE_SHUTDOWN_REASON, DesiredPod
from podvisor.services.nodeshutdown.drain import Drain, group_of
from podvisor.services.pod import pod_from_dict

GROUPS = [ShutdownGroup(0, 20), ShutdownGroup(1000, 5), ShutdownGroup(SYSTEM_CRITICAL_PRIORITY, 10)]


def desired(name: str, grace: int = 30, **spec: Any) -> DesiredPod:
    pod = pod_from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": "default", "uid": name}, "spec": {
        "terminationGracePeriodSeconds": grace, **spec,
        "containers": [{"name": "c", "image": "busybox"}]}}).pod
    return DesiredPod(pod=pod.to_dict())


@pytest.mark.parametrize(("priority", "group"), [
    (-5, 0), (0, 0), (999, 0), (1000, 1), (5000, 1), (SYSTEM_CRITICAL_PRIORITY, 2),
    (SYSTEM_CRITICAL_PRIORITY + 1000, 2)])
def test_a_pod_joins_the_highest_group_not_above_its_priority(priority: int, group: int) -> None:
    assert group_of(GROUPS, priority) == group


def test_priority_class_names_of_the_system_set_the_priority() -> None:
    from podvisor.services.pod import pod_from_wire

    for name, priority in (("system-node-critical", 2_000_001_000),
                           ("system-cluster-critical", 2_000_000_000), ("other", 0)):
        d = desired("p", priorityClassName=name)
        assert pod_from_wire(d.pod).spec.priority == priority
    d = desired("p", priorityClassName="system-node-critical", priority=7)
    assert pod_from_wire(d.pod).spec.priority == 7  # a priority given wins


def test_groups_go_in_ascending_priority_each_when_the_last_is_terminated() -> None:
    pods = {"low": desired("low"), "mid": desired("mid", grace=2, priority=1000),
            "crit": desired("crit", priority=SYSTEM_CRITICAL_PRIORITY)}
    drain = Drain(GROUPS, started=100.0)
    sent = drain.step(100.0, pods)
    assert [(r.uid, r.grace, r.reason, r.message) for r in sent] == [
        ("low", 20, NODE_SHUTDOWN_REASON, NODE_SHUTDOWN_MESSAGE)]
    # taken by the sync loop (failed), still terminating: nothing more to send, same group
    pods["low"] = replace(pods["low"], failed=True, reason=NODE_SHUTDOWN_REASON,
                          worker="terminating")
    assert drain.step(101.0, pods) == [] and drain.current == 0
    pods["low"] = replace(pods["low"], worker="terminated")
    sent = drain.step(102.0, pods)
    assert [(r.uid, r.grace) for r in sent] == [("mid", 2)]  # the pod's own grace is shorter
    assert drain.deadline == 107.0
    # mid never terminates: its group's 5 s run out, the critical group starts
    assert [r.uid for r in drain.step(107.0, pods)] == ["crit"]
    pods["crit"] = replace(pods["crit"], worker="terminated", failed=True)
    assert drain.step(108.0, pods) == [] and drain.done and drain.failed == 3


def test_a_request_the_bus_lost_goes_again_and_ended_pods_are_left_alone() -> None:
    pods = {"a": desired("a"), "done": replace(desired("done"), worker="terminated")}
    drain = Drain([ShutdownGroup(0, 30)], started=0.0)
    assert [r.uid for r in drain.step(0.0, pods)] == ["a"]
    assert drain.step(0.5, pods) == []  # not yet: once a second
    assert [r.uid for r in drain.step(1.0, pods)] == ["a"]  # desired does not say failed
    assert drain.failed == 1 and drain.next_wake(1.0) == 2.0


def test_inhibit_delay_max_scales_every_group_into_it() -> None:
    pods = {"low": desired("low"), "crit": desired("crit", priority=SYSTEM_CRITICAL_PRIORITY)}
    drain = Drain([ShutdownGroup(0, 20), ShutdownGroup(SYSTEM_CRITICAL_PRIORITY, 10)],
                  started=0.0, cap=15.0)
    assert [g.seconds for g in drain.groups] == [10, 5]
    assert [(r.uid, r.grace) for r in drain.step(0.0, pods)] == [("low", 10)]
    assert [(r.uid, r.grace) for r in drain.step(10.0, pods)] == [("crit", 5)]
    assert drain.deadline == 15.0


def test_a_group_of_no_time_still_gets_its_requests() -> None:
    pods = {"low": desired("low"), "crit": desired("crit", priority=SYSTEM_CRITICAL_PRIORITY)}
    drain = Drain([ShutdownGroup(0, 0), ShutdownGroup(SYSTEM_CRITICAL_PRIORITY, 0)],
                  started=0.0)
    assert [(r.uid, r.grace) for r in drain.step(0.0, pods)] == [("low", 0)]
    assert [(r.uid, r.grace) for r in drain.step(0.0, pods)] == [("crit", 0)]
    assert drain.step(0.0, pods) == [] and drain.done


def test_no_pods_means_done_at_once() -> None:
    drain = Drain(GROUPS, started=0.0)
    assert drain.step(0.0, {}) == [] and drain.done


def test_a_pod_refused_at_admission_is_not_part_of_any_group() -> None:
    """A pod that arrived during the drain and was refused (reason NodeShutdown) never ran:
    no FailPod for it, and its group does not wait for it."""
    pods = {"low": desired("low"),
            "late": replace(desired("late"), admitted=False, reason="NodeShutdown")}
    drain = Drain(GROUPS, started=100.0)
    assert [r.uid for r in drain.step(100.0, pods)] == ["low"]
    assert drain.members == ["low"]
    pods["low"] = replace(pods["low"], failed=True, reason=NODE_SHUTDOWN_REASON,
                          worker="terminated")
    drain.step(101.0, pods)
    assert drain.done
