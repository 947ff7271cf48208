"""The CSI client against the tests' CSI driver (a real gRPC server on a unix socket, strict
to the spec): capabilities, node info, stage and publish (idempotent), the spec's error codes
(NOT_FOUND, FAILED_PRECONDITION), volume stats, and a driver gone: UNAVAILABLE, which the
client reports as not final (the mount is uncertain). Root: the driver's bind mounts, undone
by the inverse calls."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from podvisor.services.volumes.csiclient import Capability, CsiClient, CsiError
from tests.services.volumes.claimpods import mounts_under
from tests.support.csidriver import CsiDriver

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")


@pytest.fixture
def driver() -> Iterator[CsiDriver]:
    root = Path(tempfile.mkdtemp(prefix="pvcc", dir="/tmp"))
    (root / "reg").mkdir()
    drv = CsiDriver("unit.csi.podvisor.io", root / "drv", root / "reg")
    yield drv
    drv.stop()
    for point in reversed(mounts_under(root)):
        subprocess.run(["umount", "-l", point], check=False)
    subprocess.run(["rm", "-rf", str(root)], check=False)


def test_node_calls_and_the_specs_errors(driver: CsiDriver) -> None:
    client = CsiClient(str(driver.endpoint), timeout=10)
    try:
        assert client.plugin_name() == "unit.csi.podvisor.io" and client.stages()
        assert client.node_info().node_id == "test-node"
        (driver.data / "v1").mkdir()
        staging = driver.root / "staging"
        target_parent = driver.root / "pod"
        target = target_parent / "mount"
        cap = Capability("ReadWriteOnce")
        with pytest.raises(CsiError) as err:  # the CO makes the staging folder
            client.stage("v1", str(staging), cap, {}, {}, {})
        assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION and err.value.final
        staging.mkdir()
        with pytest.raises(CsiError) as err:
            client.stage("nope", str(staging), cap, {}, {}, {})
        assert err.value.code is grpc.StatusCode.NOT_FOUND
        target_parent.mkdir()
        with pytest.raises(CsiError) as err:  # not staged yet
            client.publish("v1", str(target), str(staging), cap, False, {}, {}, {})
        assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
        client.stage("v1", str(staging), cap, {}, {}, {})
        client.stage("v1", str(staging), cap, {}, {}, {})  # idempotent
        client.publish("v1", str(target), str(staging), cap, False, {}, {}, {})
        client.publish("v1", str(target), str(staging), cap, False, {}, {}, {})
        (target / "f").write_text("12345")
        usage = client.volume_stats("v1", str(target), str(staging), 1_700_000_000.0)
        assert usage is not None and usage.used_bytes == 5 and usage.capacity_bytes > 0
        assert usage.time == 1_700_000_000.0
        with pytest.raises(CsiError) as err:  # the spec: unpublish before unstage
            client.unstage("v1", str(staging))
        assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
        client.unpublish("v1", str(target))
        client.unpublish("v1", str(target))  # idempotent
        client.unstage("v1", str(staging))
        assert not target.exists() and not mounts_under(driver.root)
    finally:
        client.close()
    driver.stop()
    gone = CsiClient(str(driver.endpoint), timeout=2)
    try:
        with pytest.raises(CsiError) as err:
            gone.unpublish("v1", str(target))
        assert err.value.code is grpc.StatusCode.UNAVAILABLE and not err.value.final
    finally:
        gone.close()


def test_a_block_capability_asks_block_access() -> None:
    """The kubelet's csiBlockMapper: block access type, no mount (no fs type, no group)."""
    cap = Capability("ReadWriteOnce", block=True).to_pb(frozenset())
    assert cap.HasField("block") and not cap.HasField("mount")
    assert Capability("ReadWriteOnce", "ext4").to_pb(frozenset()).mount.fs_type == "ext4"
