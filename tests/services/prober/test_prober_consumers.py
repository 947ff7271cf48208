"""The consumers of the ``probes`` map: status (ready/started verdicts into the PodStatus) and
the sync loop (a liveness failure reaches ``compute_pod_actions``)."""

from __future__ import annotations

from typing import Any

from podvisor.ipc.maps import DesiredPod, PlegValue, PodProbes
from podvisor.services.status.engine import StatusEngine
from podvisor.services.status.store import Saved
from tests.support.mapvalues import pod_wire
from tests.support.plegs import pleg_map

WALL = 1_000_000.0


def desired() -> dict[str, DesiredPod]:
    container = {"name": "app", "image": "host",
                 "readinessProbe": {"exec": {"command": ["true"]}},
                 "startupProbe": {"exec": {"command": ["true"]}}}
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u1"},
           "spec": {"containers": [container]}}
    return {"u1": DesiredPod(pod=pod_wire(pod), worker="syncing")}


def pleg(cid: str = "c1") -> dict[str, PlegValue]:
    return pleg_map({"_health": {"ts": 1.0}, "u1": {
        "sandboxes": [{"id": "s1", "state": "SANDBOX_READY", "ip": ""}],
        "containers": [{"id": cid, "name": "app", "state": "CONTAINER_RUNNING",
                        "created_at": 1, "started_at": int((WALL - 5) * 1e9)}]}})


def app_status(probes: dict[str, Any] | None, cid: str = "c1") -> tuple[bool, bool, str]:
    engine = StatusEngine(Saved())
    typed = None if probes is None else {
        uid: PodProbes.from_entry(entry) for uid, entry in probes.items()}
    changes = engine.reconcile(desired(), pleg(cid), WALL, 2.0, typed)
    assert changes is not None
    status = changes.set["u1"].status
    cs = status.container_statuses[0]
    ready = status.condition("Ready")
    return cs.ready, cs.started, ready.status if ready is not None else ""


def test_status_uses_probe_verdicts_of_current_container() -> None:
    item = {"container_id": "c1", "ready": True, "started": True, "liveness": None}
    assert app_status(None) == (False, False, "False")
    assert app_status({"u1": {"app": item}}) == (True, True, "True")
    assert app_status({"u1": {"app": {**item, "ready": False}}}) == (False, True, "False")
    assert app_status({"u1": {"app": item}}, cid="c2") == (False, False, "False")


def test_failed_probes_say_which_probe_failed() -> None:
    from podvisor.ipc.maps import ContainerVerdict, PodProbes
    from podvisor.services.prober import failed_probes, liveness_failed

    entry = PodProbes(containers={
        "a": ContainerVerdict("c1", liveness="failure", failed_probe="startup"),
        "b": ContainerVerdict("c2", liveness="failure", failed_probe="liveness"),
        "c": ContainerVerdict("c3", liveness="success")})
    assert failed_probes(entry) == {"c1": "startup", "c2": "liveness"}
    assert liveness_failed(entry) == set(failed_probes(entry))
    assert failed_probes(None) == {}
