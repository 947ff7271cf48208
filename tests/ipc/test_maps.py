"""The declared maps and their values (ipc/maps.py): every map's spec, wire round trips, and what
a replica drops."""

from __future__ import annotations

from typing import Any

import pytest

from podvisor.ipc.maps import (
    API_MIRRORS,
    DESIRED,
    MAPS,
    NODE_SHUTDOWN,
    PLEG,
    POD_SOURCES,
    PRESSURE,
    PROBES,
    STATUSES,
    ContainerVerdict,
    ContainerWaiting,
    DesiredPod,
    MapSpec,
    MapValueError,
    MirrorPod,
    MirrorSet,
    NodePressure,
    NodeShutdownState,
    PlegContainer,
    PlegHealth,
    PlegPod,
    PlegSandbox,
    PodProbes,
    PodRef,
    PodSetValue,
    PodStatusValue,
    RuntimeNetwork,
    UndeclaredMap,
    declared,
    decode_desired,
    decode_pleg,
    pods_map,
)
from podvisor.ipc.podstatus import PodStatus


def test_pod_probes_round_trip_and_reject_what_they_do_not_declare() -> None:
    value = PodProbes({"app": ContainerVerdict("c1", ready=True, started=None,
                                               liveness="failure", failed_probe="liveness",
                                               ts=3.0)})
    assert PodProbes.from_wire(value.to_wire()) == value
    assert PodProbes.from_entry({"app": value.containers["app"].to_wire()}) == value
    bad: list[tuple[Any, str]] = [
        ({**value.to_wire(), "v": 2}, "version"),
        ({"v": 1, "containers": {"app": {"ready": True}}}, "fields"),
        ({"v": 1, "containers": {"app": {"container_id": "c1", "ready": "yes"}}}, "fields"),
        ([], "fields"),
    ]
    for raw, reason in bad:
        with pytest.raises(MapValueError) as err:
            PodProbes.from_wire(raw)
        assert err.value.reason == reason


def test_pod_set_value_round_trip_and_equality_ignores_the_read_time() -> None:
    value = PodSetValue("file", [{"metadata": {"name": "a"}}], [], 1.0)
    assert PodSetValue.from_wire(value.to_wire()) == value
    assert PodSetValue("file", value.pods, [], 9.0) == value  # a re-read with nothing new
    with pytest.raises(MapValueError) as err:
        PodSetValue.from_wire({**value.to_wire(), "v": 0})
    assert err.value.reason == "version"


def _desired_pod() -> DesiredPod:
    return DesiredPod(pod={"metadata": {"name": "web", "namespace": "default", "uid": "u1"},
                           "spec": {"containers": [{"name": "app", "image": "host"}]}},
                      source="file", worker="syncing", admitted=True, reason="",
                      message="boom", waiting={"app": ContainerWaiting("CrashLoopBackOff", "b")},
                      sandbox_id="sb1", updated_at=5.0, qos_class="BestEffort")


def test_desired_values_round_trip_by_kind() -> None:
    pod, runtime = _desired_pod(), RuntimeNetwork(False, "NoCni", "x", "not ready: x")
    assert decode_desired(pod.to_wire()) == pod and isinstance(decode_desired(pod.to_wire()),
                                                               DesiredPod)
    assert decode_desired(runtime.to_wire()) == runtime
    assert DesiredPod.from_wire({"v": 1, "kind": "pod", "pod": {}, "admitted": True}) \
        == DesiredPod(pod={})  # absent optional fields take their defaults
    assert _desired_pod().active and not DesiredPod(pod={}, worker="terminated").active
    assert not DesiredPod(pod={}, admitted=False).active


@pytest.mark.parametrize(("raw", "reason"), [
    ({"v": 2, "kind": "pod", "pod": {}, "admitted": True}, "version"),  # a newer sync loop
    ({"pod": {}, "worker": "syncing", "admitted": True}, "version"),  # the untyped v0 form
    ({"networkReady": True, "condition": "ok"}, "version"),  # the untyped v0 _runtime
    ({"v": 1, "kind": "mystery"}, "fields"),
    ({"v": 1, "kind": "pod", "pod": "x", "admitted": True}, "fields"),
    ({"v": 1, "kind": "pod", "pod": {}, "admitted": "yes"}, "fields"),
    ({"v": 1, "kind": "pod", "pod": {}, "admitted": True, "waiting": {"a": {"reason": 3}}},
     "fields"),
    ({"v": 1, "kind": "pod", "pod": {}, "admitted": True, "updated_at": "now"}, "fields"),
    ({"v": 1, "kind": "pod", "pod": {}, "admitted": True, "sandbox_id": None}, "fields"),
    ({"v": 1, "kind": "runtime", "networkReady": "no"}, "fields"),
    ([1, 2], "fields"),
    (None, "fields"),
])
def test_desired_values_that_are_not_declared_are_rejected(raw: Any, reason: str) -> None:
    with pytest.raises(MapValueError) as err:
        decode_desired(raw)
    assert err.value.reason == reason


def test_the_desired_map_has_its_codec_in_its_spec() -> None:
    assert DESIRED.decode(DESIRED.encode(_desired_pod())) == _desired_pod()
    assert _desired_pod().ref == PodRef("web", "default", "u1")
    assert DesiredPod(pod={"metadata": {"annotations": {"a": "b"}}}).annotations == {"a": "b"}
    assert DesiredPod(pod={"metadata": []}).ref == PodRef() and DesiredPod(pod={}).annotations == {}


def test_every_map_is_declared_once_by_name() -> None:
    """``MAPS`` holds one spec per map (its name is its topic and snapshot socket);
    ``declared`` and ``pods_map`` refuse a name nobody declared."""
    names = {"desired", "pleg", "probes", "statuses", "api-mirrors", "pressure",
             "node-shutdown",
             *(f"pods-{s}" for s in POD_SOURCES)}
    assert set(MAPS) == names and all(MAPS[n].name == n for n in names)
    assert all(isinstance(spec, MapSpec) and spec.owner for spec in MAPS.values())
    assert declared("pleg") is PLEG and declared("probes") is PROBES
    assert pods_map("api") is MAPS["pods-api"] and pods_map("file").owner == "source-file"
    with pytest.raises(UndeclaredMap, match="not declared"):
        declared("mystery")
    with pytest.raises(UndeclaredMap, match="no pod source"):
        pods_map("ftp")


def test_node_pressure_round_trip_and_what_it_rejects() -> None:
    value = NodePressure(("MemoryPressure", "DiskPressure"), 5.0)
    assert PRESSURE.decode(PRESSURE.encode(value)) == value and PRESSURE.owner == "eviction"
    assert NodePressure.from_wire({"v": 1}) == NodePressure()
    for raw in ({"v": 2}, {"v": 1, "conditions": ["Hungry"]}, {"v": 1, "conditions": "x"},
                {"v": 1, "ts": True}):
        with pytest.raises(MapValueError):
            NodePressure.from_wire(raw)


def test_node_shutdown_state_round_trip_and_what_it_rejects() -> None:
    value = NodeShutdownState(True, "logind", 12.5)
    assert NODE_SHUTDOWN.decode(NODE_SHUTDOWN.encode(value)) == value
    assert NodeShutdownState.from_wire({"v": 1}) == NodeShutdownState()
    for raw, reason in (({"v": 2}, "version"), ({"v": 1, "active": "yes"}, "fields"),
                        ({"v": 1, "since": "now"}, "fields"), ("x", "fields")):
        with pytest.raises(MapValueError) as err:
            NodeShutdownState.from_wire(raw)
        assert err.value.reason == reason


def test_mirror_set_round_trip_and_what_it_rejects() -> None:
    value = MirrorSet((MirrorPod("web", "default", "m1", "h1"),))
    assert API_MIRRORS.decode(API_MIRRORS.encode(value)) == value
    assert MirrorSet.from_wire({"v": 1}) == MirrorSet()
    bad: list[tuple[Any, str]] = [
        ([{"name": "web"}], "fields"),  # the untyped v0 form: a bare list
        ({"v": 2, "mirrors": []}, "version"),
        ({"v": 1, "mirrors": {}}, "fields"),
        ({"v": 1, "mirrors": [{"name": "web", "uid": 3}]}, "fields"),
    ]
    for raw, reason in bad:
        with pytest.raises(MapValueError) as err:
            MirrorSet.from_wire(raw)
        assert err.value.reason == reason


def test_pod_status_value_round_trip_and_what_it_rejects() -> None:
    value = PodStatusValue(PodStatus.from_dict({"phase": "Running",
                                                "conditions": [{"type": "Ready"}]}), 4,
                           PodRef("web", "default", "u1"))
    assert PodStatusValue.from_wire(value.to_wire()) == value
    assert STATUSES.decode(STATUSES.encode(value)) == value
    assert value.status.condition("Ready") is not None
    bad: list[tuple[Any, str]] = [
        ({**value.to_wire(), "v": 2}, "version"),  # a newer status process
        ({"phase": "Running", "_version": 4}, "version"),  # the untyped v0 form
        ({"v": 1, "status": [], "version": 1}, "fields"),
        ({"v": 1, "status": {}, "version": "1"}, "fields"),
        ({"v": 1, "status": {}, "version": True}, "fields"),
        ({"v": 1, "status": {}, "pod": {"name": 3}}, "fields"),
        ({"v": 1, "status": {"phase": 3}}, "fields"),
        ({"v": 1, "status": {"containerStatuses": [{"name": "a", "restartCount": "1"}]}},
         "fields"),
        ({"v": 1, "status": {"conditions": {}}}, "fields"),
        ("Running", "fields"),
    ]
    for raw, reason in bad:
        with pytest.raises(MapValueError) as err:
            PodStatusValue.from_wire(raw)
        assert err.value.reason == reason


def _pleg_pod() -> PlegPod:
    return PlegPod(ts=3.0, name="web", namespace="default",
                   sandboxes=(PlegSandbox("sb1", "SANDBOX_READY", 10, 0, "10.0.0.2", ("fd::2",)),),
                   containers=(PlegContainer("c1", "app", "CONTAINER_EXITED", "sb1", 1, 11, 12,
                                             13, 2, "Error", "m", "host", "sha256:x", "h1", 1,
                                             "/log"),))


def test_pleg_values_round_trip_by_kind() -> None:
    pod = _pleg_pod()
    health = PlegHealth(ts=3.0, last_relist_ok=100.0, last_relist_ms=1.5, events_mode="stream",
                        relists=4, relist_errors=1, stream_events=2, event_drops=0,
                        stream_drops=0)
    assert decode_pleg(pod.to_wire()) == pod and decode_pleg(health.to_wire()) == health
    assert pod.container("c1") is pod.containers[0] and pod.container("c2") is None
    assert PLEG.decode(PLEG.encode(pod)) == pod  # its spec's codec
    assert decode_pleg({"v": 1, "kind": "pod", "ts": 1}) == PlegPod(ts=1.0)  # defaults


@pytest.mark.parametrize(("raw", "reason"), [
    ({**_pleg_pod().to_wire(), "v": 2}, "version"),  # a newer PLEG
    ({"ts": 1.0, "name": "web", "namespace": "default", "sandboxes": [], "containers": []},
     "version"),  # the untyped v0 record
    ({"last_relist_ok": 1.0, "ts": 1.0, "relists": 1}, "version"),  # the untyped v0 _health
    ({"v": 1, "kind": "mystery"}, "fields"),
    ({"v": 1, "kind": "pod", "containers": {}}, "fields"),
    ({"v": 1, "kind": "pod", "ts": "now"}, "fields"),
    ({"v": 1, "kind": "pod", "containers": [{"id": "c1", "name": "app"}]}, "fields"),
    ({"v": 1, "kind": "pod", "containers": [{"id": "c1", "name": "a", "state": "S",
                                             "exit_code": "1"}]}, "fields"),
    ({"v": 1, "kind": "pod", "sandboxes": [{"id": "s", "state": "S", "attempt": True}]},
     "fields"),
    ({"v": 1, "kind": "pod", "sandboxes": [{"id": "s", "state": "S", "additional_ips": [1]}]},
     "fields"),
    ({"v": 1, "kind": "health", "relists": 1.5}, "fields"),
    ("pod", "fields"),
])
def test_pleg_values_that_are_not_declared_are_rejected(raw: Any, reason: str) -> None:
    with pytest.raises(MapValueError) as err:
        decode_pleg(raw)
    assert err.value.reason == reason
