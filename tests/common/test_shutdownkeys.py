"""Graceful node shutdown's config keys (``common/shutdownkeys.py``): the kubelet's
migrateConfig from shutdownGracePeriod/shutdownGracePeriodCriticalPods, the by-priority list,
and shutdownOnSignal's need of a period."""

from __future__ import annotations

import pytest

from podvisor.common.config import ConfigError, config_from_mapping, node_shutdown_groups
from podvisor.common.shutdownkeys import ShutdownGroup


def groups(raw: dict[str, object]) -> list[ShutdownGroup]:
    return node_shutdown_groups(config_from_mapping(raw))


def test_the_two_periods_migrate_as_the_kubelets() -> None:
    assert groups({"shutdownGracePeriod": "30s", "shutdownGracePeriodCriticalPods": "10s"}) == [
        ShutdownGroup(0, 20), ShutdownGroup(2_000_000_000, 10)]
    assert groups({"shutdownGracePeriod": "30s"}) == [
        ShutdownGroup(0, 30), ShutdownGroup(2_000_000_000, 0)]
    assert groups({}) == []  # off by default
    assert groups({"shutdownGracePeriod": "10s", "shutdownGracePeriodCriticalPods": "20s"}) == []


def test_by_pod_priority_replaces_them_sorted() -> None:
    raw = {"shutdownGracePeriod": "30s", "shutdownGracePeriodByPodPriority": [
        {"priority": 100000, "shutdownGracePeriodSeconds": 3},
        {"priority": 0, "shutdownGracePeriodSeconds": 7}]}
    assert groups(raw) == [ShutdownGroup(0, 7), ShutdownGroup(100000, 3)]


@pytest.mark.parametrize(("raw", "key"), [
    ({"shutdownGracePeriodByPodPriority": {"priority": 1}}, "shutdownGracePeriodByPodPriority"),
    ({"shutdownGracePeriodByPodPriority": [{"priority": 1, "seconds": 2}]},
     "shutdownGracePeriodByPodPriority[0]"),
    ({"shutdownGracePeriodByPodPriority": [{"priority": 1, "shutdownGracePeriodSeconds": -1}]},
     "shutdownGracePeriodByPodPriority[0].shutdownGracePeriodSeconds"),
    ({"shutdownOnSignal": True}, "shutdownOnSignal"),
])
def test_bad_values_name_their_key(raw: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_mapping(raw)
    assert err.value.key == key
