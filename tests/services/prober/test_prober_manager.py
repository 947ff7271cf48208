"""ProbeManager (services/prober/manager.py) and the consumers' readers (verdicts.py): desired +
pleg in, due probes out, the ``probes`` map values; injected clocks, no I/O."""

from __future__ import annotations

import dataclasses
from typing import Any

from podvisor.ipc.maps import DesiredPod, PodProbes
from podvisor.services.pod import pod_from_dict
from podvisor.services.prober import manager as manager_module
from podvisor.services.prober.manager import ProbeManager, ProbeTask, declares_probes
from podvisor.services.prober.verdicts import liveness_failed, probe_verdicts
from podvisor.services.prober.worker import Kind, Result
from tests.support.plegs import pleg_map

S, F = Result.SUCCESS, Result.FAILURE
WALL = 1_000_000.0


def probe(period: int = 1, failure: int = 1, **extra: Any) -> dict[str, Any]:
    return {"exec": {"command": ["true"]}, "periodSeconds": period,
            "failureThreshold": failure, **extra}


def desired(**probes: Any) -> dict[str, DesiredPod]:
    container = {"name": "app", "image": "host", "ports": [{"name": "web",
                                                            "containerPort": 8080}], **probes}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
           "spec": {"containers": [container], "hostNetwork": True}}
    # as the sync loop publishes it: the wire form of the pod its source validated
    return {"u1": DesiredPod(pod=pod_from_dict(pod).pod.to_dict(), worker="syncing")}


def pleg(cid: str = "c1", state: str = "CONTAINER_RUNNING", started: float = WALL - 50
         ) -> dict[str, Any]:
    return pleg_map({"_health": {"ts": 1.0}, "u1": {
        "sandboxes": [{"id": "s1", "state": "SANDBOX_READY", "ip": ""}],
        "containers": [{"id": cid, "name": "app", "state": state, "created_at": 1,
                        "started_at": int(started * 1e9)}]}})


def run_due(m: ProbeManager, now: float, outcome: Result | dict[Kind, Result]) -> list[ProbeTask]:
    tasks = m.due(now)
    for t in tasks:
        r = outcome if isinstance(outcome, Result) else outcome[t.key[2]]
        m.complete(t, r, now)
    return tasks


def manager(now: float = 0.0, seeds: Any = None) -> ProbeManager:
    return ProbeManager(lambda: 0.0, now - 100.0, seeds)


def test_readiness_flow_and_entry() -> None:
    m = manager()
    m.update(desired(readinessProbe=probe()), pleg(), 0.0, WALL)
    assert m.entries(0.0)["u1"]["app"]["ready"] is False
    tasks = run_due(m, 0.0, S)
    assert [t.key for t in tasks] == [("u1", "app", Kind.READINESS)]
    assert tasks[0].target.host == "127.0.0.1" and tasks[0].target.ports == {"web": 8080}
    entry = m.entries(1.0)["u1"]["app"]
    assert entry == {"container_id": "c1", "ready": True, "started": None, "liveness": None,
                     "failed_probe": None, "ts": 1.0}
    assert m.entries(5.0)["u1"]["app"]["ts"] == 1.0  # unchanged verdict keeps its ts
    assert m.next_deadline() == 1.0


def test_startup_gates_other_probes_then_releases_them() -> None:
    m = manager()
    m.update(desired(readinessProbe=probe(period=10), livenessProbe=probe(period=10),
                     startupProbe=probe(period=10, failure=3)), pleg(), 0.0, WALL)
    assert [t.key[2] for t in run_due(m, 0.0, F)] == [Kind.STARTUP]
    e = m.entries(0.0)["u1"]["app"]
    assert (e["ready"], e["started"], e["liveness"]) == (False, False, "success")
    assert [t.key[2] for t in run_due(m, 10.0, S)] == [Kind.STARTUP]
    # startup succeeded: liveness and readiness are due at once, startup no longer runs
    assert sorted(t.key[2] for t in run_due(m, 10.0, S)) == [Kind.LIVENESS, Kind.READINESS]
    e = m.entries(10.0)["u1"]["app"]
    assert (e["ready"], e["started"], e["liveness"]) == (True, True, "success")
    assert sorted(t.key[2] for t in run_due(m, 20.0, S)) == [Kind.LIVENESS, Kind.READINESS]


def test_startup_failure_is_a_kill_verdict() -> None:
    m = manager()
    m.update(desired(startupProbe=probe(failure=1)), pleg(), 0.0, WALL)
    run_due(m, 0.0, F)
    e = m.entries(0.0)["u1"]["app"]
    assert (e["liveness"], e["failed_probe"], e["started"]) == ("failure", "startup", False)
    assert liveness_failed(PodProbes.from_entry(m.entries(0.0)["u1"])) == {"c1"}


def test_liveness_failure_then_new_container() -> None:
    m = manager()
    m.update(desired(livenessProbe=probe(failure=2)), pleg(), 0.0, WALL)
    run_due(m, 0.0, F)
    assert m.entries(0.0)["u1"]["app"]["liveness"] == "success"
    run_due(m, 1.0, F)
    assert m.entries(1.0)["u1"]["app"]["liveness"] == "failure"
    assert run_due(m, 2.0, F) == []  # on hold
    m.update(desired(livenessProbe=probe(failure=2)), pleg("c2", started=WALL), 2.5, WALL)
    assert m.entries(2.5)["u1"]["app"] == {"container_id": "c2", "ready": None,
                                          "started": None, "liveness": "success",
                                          "failed_probe": None, "ts": 2.5}
    assert [t.target.container_id for t in run_due(m, 2.5, S)] == ["c2"]


def test_no_entry_for_stopped_container_and_removed_pod() -> None:
    m = manager()
    m.update(desired(readinessProbe=probe()), pleg(state="CONTAINER_EXITED"), 0.0, WALL)
    assert m.due(0.0) == [] and m.entries(0.0) == {}
    m.update({}, pleg(), 1.0, WALL)
    assert m.workers == {} and m.entries(1.0) == {}


def test_spec_change_restarts_worker() -> None:
    m = manager()
    m.update(desired(readinessProbe=probe()), pleg(), 0.0, WALL)
    run_due(m, 0.0, S)
    m.update(desired(readinessProbe=probe(period=5)), pleg(), 1.0, WALL)
    assert m.entries(1.0)["u1"]["app"]["ready"] is False


def test_initial_delay_uses_container_start_time() -> None:
    m = manager()
    # started 2 s ago (wall), initial delay 5 s: first probe 3 s from now
    m.update(desired(readinessProbe=probe(10, initialDelaySeconds=5)), pleg(started=WALL - 2),
             10.0, WALL)
    assert m.due(10.0) == []
    assert abs((m.next_deadline() or 0) - 13.0) < 1e-6
    assert len(m.due(13.0)) == 1


def test_seeds_keep_readiness_across_restart() -> None:
    saved = {"u1": {"app": {"container_id": "c1", "ready": True, "started": None,
                            "liveness": None, "failed_probe": None, "ts": 3.0}}}
    m = manager(seeds=saved)
    m.update(desired(readinessProbe=probe(failure=3)), pleg(), 0.0, WALL)
    assert m.entries(0.0) == saved  # same verdict, same ts: nothing to publish
    run_due(m, 0.0, F)
    assert m.entries(0.0)["u1"]["app"]["ready"] is True
    stale = manager(seeds=saved)
    stale.update(desired(readinessProbe=probe()), pleg("c9"), 0.0, WALL)
    assert stale.entries(0.0)["u1"]["app"]["ready"] is False


def test_jittered_first_probe_after_prober_start() -> None:
    m = ProbeManager(lambda: 0.5, 0.0)
    m.update(desired(readinessProbe=probe(period=10)), pleg(), 1.0, WALL)
    assert m.due(1.0) == [] and m.next_deadline() == 6.0


def test_verdicts_only_for_current_container() -> None:
    entry = PodProbes.from_entry(
        {"app": {"container_id": "c1", "ready": True, "started": True, "liveness": None}})
    assert probe_verdicts(entry, pleg()["u1"]) == ({"app": True}, {"app": True})
    assert probe_verdicts(entry, pleg("c2")["u1"]) == ({}, {})
    assert probe_verdicts(None, pleg()["u1"]) == ({}, {})
    assert liveness_failed(PodProbes.from_entry(
        {"app": {"container_id": "c1", "liveness": "success"}})) == set()


def test_update_of_named_pods_only_touches_them() -> None:
    m = manager()
    two = {**desired(readinessProbe=probe())}
    other = dataclasses.replace(two["u1"], pod={
        **two["u1"].pod, "metadata": {"name": "q", "namespace": "default", "uid": "u2"}})
    two["u2"] = other
    maps = {**pleg(), "u2": pleg(cid="c2")["u1"]}
    m.update(two, maps, 0.0, WALL)
    assert {k[0] for k in m.workers} == {"u1", "u2"}
    kept = m.workers[("u1", "app", Kind.READINESS)]
    m.update({"u1": two["u1"]}, {**maps, "u1": pleg(cid="c9")["u1"]}, 1.0, WALL, only={"u2"})
    assert set(m.workers) == {("u1", "app", Kind.READINESS)}  # u2 gone, u1 not looked at
    assert m.workers[("u1", "app", Kind.READINESS)] is kept and kept.container_id == "c1"
    assert set(m.entries(1.0)) == {"u1"}
    m.update({"u1": two["u1"]}, {**maps, "u1": pleg(cid="c9")["u1"]}, 2.0, WALL, only={"u1"})
    assert kept.container_id == "c9" and m.entries(2.0)["u1"]["app"]["container_id"] == "c9"


def test_declares_probes() -> None:
    with_probe = desired(readinessProbe=probe())["u1"].pod
    without = desired()["u1"].pod
    assert declares_probes(with_probe) and not declares_probes(without)
    assert not declares_probes({**without, "spec": {"containers": []}})
    assert not declares_probes({"spec": {"containers": [{"name": "a", "livenessProbe": None}]}})
    # malformed: parsed as before (and rejected there)
    assert declares_probes({"spec": {"containers": "x"}}) and declares_probes(None)
    assert declares_probes({"spec": {"containers": ["x"]}})


def test_pods_without_probes_are_not_parsed_and_concern_nobody(monkeypatch: Any) -> None:
    parsed: list[Any] = []
    real = manager_module.pod_from_wire
    monkeypatch.setattr(manager_module, "pod_from_wire",
                        lambda raw, **kw: parsed.append(raw) or real(raw, **kw))
    m = manager()
    m.update(desired(), pleg(), 0.0, WALL)
    assert parsed == [] and m.workers == {}
    assert not m.concerns("u1") and not m.concerns("u1", desired()["u1"])
    assert m.concerns("u1", desired(readinessProbe=probe())["u1"])  # a probe appears
    m.update(desired(readinessProbe=probe()), pleg(), 1.0, WALL)
    assert len(parsed) == 1 and m.concerns("u1")  # it has workers: every change counts
    assert m.concerns("u1", None)  # its deletion too


def test_a_malformed_desired_pod_gets_no_workers_and_is_reported() -> None:
    """The sync loop publishes validated pods only: anything else is a bug upstream, rebuilt
    by nobody; the manager reports it (the service logs it) and the other pods go on."""
    invalid: list[tuple[str, str]] = []
    m = ProbeManager(lambda: 0.0, -100.0, on_invalid=lambda uid, err: invalid.append(
        (uid, err.summary())))
    good = desired(readinessProbe=probe())
    broken = dataclasses.replace(good["u1"], pod={"kind": "Pod", "spec": {"containers": "x"}})
    m.update({"u1": good["u1"], "u2": broken}, {**pleg(), "u2": pleg()["u1"]}, 0.0, WALL)
    assert {k[0] for k in m.workers} == {"u1"}
    assert [uid for uid, _ in invalid] == ["u2"]
    assert "not a validated pod wire form" in invalid[0][1]


def test_a_change_that_does_not_touch_probes_keeps_the_workers() -> None:
    m = manager()
    m.update(desired(readinessProbe=probe()), pleg(), 0.0, WALL)
    run_due(m, 0.0, S)
    kept = m.workers[("u1", "app", Kind.READINESS)]
    moved = desired(readinessProbe=probe())
    moved["u1"] = dataclasses.replace(moved["u1"], sandbox_id="s1", updated_at=5.0,
                                      worker="running")
    m.update(moved, pleg(), 1.0, WALL, only={"u1"})
    assert m.workers[("u1", "app", Kind.READINESS)] is kept
    assert m.entries(1.0)["u1"]["app"]["ready"] is True
