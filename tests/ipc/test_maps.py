"""The declared map values (ipc/maps.py): wire round trips, and what a replica drops."""

from __future__ import annotations

from typing import Any

import pytest

from podvisor.ipc.maps import ContainerVerdict, MapValueError, PodProbes, PodSetValue


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
