"""The container resources the sync loop sends over CRI: the kubelet's arithmetic
(MilliCPUToShares, milliCPUToQuota, memory limit as is), hugepages passed on (the runtime
enforces or refuses them), and the pod model's rules for resource fields."""

from __future__ import annotations

from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.pod import PodValidationError, pod_from_dict
from podvisor.services.syncloop.cri_config import (
    _resources,
    hugepage_size_name,
    milli_cpu_to_quota,
    milli_cpu_to_shares,
)

MI = 1024 * 1024


def pod(container_resources: dict[str, Any], **spec: Any) -> Any:
    return pod_from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                          "spec": {"containers": [{"name": "c", "image": "host",
                                                   "resources": container_resources}], **spec}})


def resources_of(resources: dict[str, Any]) -> pb.LinuxContainerResources:
    return _resources(pod(resources).pod.spec.containers[0], None)


@pytest.mark.parametrize(("milli", "shares"), [(0, 2), (1, 2), (2, 2), (100, 102),
                                               (200, 204), (1000, 1024), (1500, 1536),
                                               (256_000, 262_144), (300_000, 262_144)])
def test_milli_cpu_to_shares_is_the_kubelets(milli: int, shares: int) -> None:
    assert milli_cpu_to_shares(milli) == shares


@pytest.mark.parametrize(("milli", "quota"), [(0, 0), (1, 1000), (5, 1000), (10, 1000),
                                              (200, 20_000), (1000, 100_000),
                                              (2500, 250_000)])
def test_milli_cpu_to_quota_is_the_kubelets(milli: int, quota: int) -> None:
    assert milli_cpu_to_quota(milli) == quota


def test_guaranteed_container() -> None:
    res = resources_of({"limits": {"cpu": "200m", "memory": "50Mi"}})
    assert (res.cpu_shares, res.cpu_quota, res.cpu_period, res.memory_limit_in_bytes) == (
        204, 20_000, 100_000, 50 * MI)  # requests default to the limits


def test_burstable_container() -> None:
    res = resources_of({"requests": {"cpu": "100m", "memory": "10Mi"},
                        "limits": {"memory": "50Mi"}})
    assert (res.cpu_shares, res.cpu_quota, res.cpu_period, res.memory_limit_in_bytes) == (
        102, 0, 0, 50 * MI)


def test_best_effort_container_asks_for_nothing() -> None:
    assert resources_of({}) == pb.LinuxContainerResources()


def test_zero_cpu_limit_means_no_quota() -> None:
    res = resources_of({"requests": {"cpu": "0"}, "limits": {"cpu": "0"}})
    assert (res.cpu_shares, res.cpu_quota) == (2, 0)


def test_hugepages_are_passed_to_the_runtime() -> None:
    res = resources_of({"limits": {"hugepages-2Mi": "4Mi", "memory": "50Mi"}})
    assert [(h.page_size, h.limit) for h in res.hugepage_limits] == [("2MB", 4 * MI)]
    assert [hugepage_size_name(s) for s in (2 * MI, 1024 * MI, 64 * 1024)] == \
        ["2MB", "1GB", "64KB"]


def test_hugepages_bad_page_size_is_an_error() -> None:
    with pytest.raises(PodValidationError) as err:
        pod({"limits": {"hugepages-x": "4Mi"}})
    assert "hugepages-x" in str(err.value)


def test_ephemeral_storage_is_kept_not_sent_to_the_runtime() -> None:
    """Eviction enforces it (issue 27); the runtime gets nothing of it."""
    parsed = pod({"limits": {"ephemeral-storage": "1Gi"}})
    assert not any("ephemeral-storage" in str(w) for w in parsed.warnings)
    assert parsed.pod.spec.containers[0].resources.limits.ephemeral_storage_bytes == 1 << 30


def test_pod_level_resources_are_refused() -> None:
    with pytest.raises(PodValidationError) as err:
        pod({}, resources={"limits": {"memory": "1Gi"}})
    assert "pod-level resources (spec.resources) are not supported" in str(err.value)
