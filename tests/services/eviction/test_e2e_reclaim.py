"""End to end: node-level reclaim before eviction (the kubelet's ``reclaimNodeLevelResources``)
under disk pressure the test makes, never the machine's. A real agent (embedded runtime) on the
stand-in API server, its ``rootDir`` on a 128Mi tmpfs the test mounts, under
``nodefs.available<50%`` and ``imagefs.available<50%``: the eviction process asks the imagegc
process (``ReclaimNodeResources``) to remove the unused dead containers and images, reads the
filesystem again and evicts only if the threshold is still met.

- Reclaim suffices: a pulled image nothing uses (a 12Mi random layer: about 24Mi in the store)
  and the dead container of a pod failed for good (evicted over its ephemeral-storage limit:
  its log of more than 16Mi) are removed once the test's ballast file pushes the filesystem
  over the threshold, and no other pod is evicted.
- Reclaim falls short: a running BestEffort pod fills an emptyDir; imagegc is asked and
  answers first, then the filler is evicted."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.services.eviction.test_e2e_eviction import GUARANTEED, Cluster, pod, start, tmpfs
from tests.support.registry import push_bulky_image, registries

MI = 1 << 20
DISK = {"nodefs.available": "50%", "imagefs.available": "50%"}
WRITE = "import sys; sys.stdout.write(('x' * 1023 + '\\n') * {kib})"


@pytest.fixture
def disk128() -> Iterator[Path]:
    """A 128Mi tmpfs (rootDir's filesystem)."""
    with tmpfs("128m", "pvrc") as where:
        yield where


def chatty(name: str, node: str, kib: int, limit: str) -> dict[str, Any]:
    """A pod that writes ``kib`` KiB to its log and sleeps, its container limited to
    ``limit`` of ephemeral storage."""
    p = pod(name, node, ["sh", "-c", f'python3 -c "{WRITE.format(kib=kib)}"; sleep 3600'])
    p["spec"]["containers"][0]["resources"] = {"limits": {"ephemeral-storage": limit}}
    return p


def events(c: Cluster, reason: str) -> list[dict[str, Any]]:
    out = c.handle.ctl("events", "--json")
    return [e for e in json.loads(out.stdout)["items"] if e["reason"] == reason]


def log_files(root: Path, name: str) -> list[Path]:
    return list((root / "pod-logs").glob(f"default_{name}_*/*/*.log"))


def available(where: Path) -> int:
    st = shutil.disk_usage(where)
    return st.free


def images(c: Cluster) -> list[str]:
    out = c.handle.ctl("images", "--json")
    assert out.returncode == 0, out.stderr
    return [t for i in json.loads(out.stdout) for t in i["repoTags"]]


@pytest.mark.timeout(300)
def test_reclaim_of_dead_containers_and_unused_images_spares_every_pod(
        disk128: Path, agent: Any, wait_for: Any, tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        base = Path(tempfile.mkdtemp(prefix="pvrc", dir="/tmp"))
        stack.callback(shutil.rmtree, base, True)
        reg, _ = stack.enter_context(registries(base / "reg"))
        bulky = f"{reg.host}/podvisor/bulky:1"
        push_bulky_image(reg, base, "podvisor/bulky:1", 12 * MI)
        root = disk128 / "root"
        c = start(agent, tmp_path, "e2e-reclaim", {
            "rootDir": str(root), "evictionHard": DISK, "imageMinimumGCAge": "0s",
            "containerLogMaxSize": "200Mi"})
        stack.callback(c.api.stop)
        try:
            c.api.create_pod("default", pod("steady", c.node, ["sleep", "3600"], GUARANTEED))
            wait_for(lambda: c.phase("steady") == "Running", 90.0, 0.2, "steady Running")
            assert c.handle.ctl("images", "pull", bulky, timeout=120).returncode == 0
            # a pod over its ephemeral-storage limit (its 24Mi log) is evicted at once (local
            # storage, no reclaim): failed for good, its dead container and log stay
            c.api.create_pod("default", chatty("chatty", c.node, 24 * 1024, "16Mi"))
            wait_for(lambda: c.phase("chatty") == "Failed", 90.0, 0.2, "chatty evicted")
            assert c.status("chatty")["reason"] == "Evicted"
            [log] = log_files(root, "chatty")
            assert log.stat().st_size > 16 * MI
            wait_for(lambda: c.condition("DiskPressure") == "False", 60.0, 0.2, "no pressure")
            assert available(disk128) > 64 * MI
            # the test's own ballast takes the filesystem under 50 % available (40Mi left);
            # the image and the log free at least 40Mi more
            ballast = disk128 / "ballast"
            ballast.write_bytes(b"\0" * (available(disk128) - 40 * MI))
            found = wait_for(lambda: events(c, "NodeResourcesReclaimed"), 60.0, 0.2,
                             "the reclaim's event")
            assert found[0]["message"].endswith(
                "to reclaim ephemeral-storage: able to reduce resource pressure without "
                "evicting pods."), found[0]["message"]
            assert events(c, "EvictionThresholdMet")[0]["message"] == (
                "Attempting to reclaim ephemeral-storage")
            assert not log.exists()  # the dead container went with its log
            assert bulky not in images(c)  # the unused image too
            assert available(disk128) > 64 * MI
            wait_for(lambda: c.condition("DiskPressure") == "False", 90.0, 0.2,
                     "DiskPressure clear after the transition period")
            assert c.phase("steady") == "Running"
            assert [e["involvedObject"]["name"] for e in events(c, "Evicted")] == ["chatty"]
            st = c.status("chatty")  # it keeps what it reported of its container
            assert (st["phase"], st["reason"]) == ("Failed", "Evicted")
            assert "terminated" in st["containerStatuses"][0]["state"]
            evict_log = (c.handle.paths.logs_dir / "eviction.log").read_text()
            assert "must evict" not in evict_log
            assert evict_log.count("eviction.pod.evicted") == 1  # chatty's, before
        except AssertionError:
            print(c.logs())
            raise


@pytest.mark.timeout(300)
def test_a_reclaim_that_falls_short_is_followed_by_the_eviction_of_the_ranked_pod(
        disk128: Path, agent: Any, wait_for: Any, tmp_path: Path) -> None:
    root = disk128 / "root"
    c = start(agent, tmp_path, "e2e-reclaim-short", {
        "rootDir": str(root), "evictionHard": DISK, "containerLogMaxSize": "200Mi"})
    try:
        c.api.create_pod("default", pod("steady", c.node, ["sleep", "3600"], GUARANTEED))
        wait_for(lambda: c.phase("steady") == "Running", 90.0, 0.2, "steady Running")
        c.api.create_pod("default", pod("filler", c.node, [
            "sh", "-c", "dd if=/dev/zero of=/scratch/fill bs=1M count=72; sleep 3600"],
            volume=True))
        wait_for(lambda: c.phase("filler") == "Failed", 120.0, 0.2, "filler Failed (evicted)")
        st = c.status("filler")
        assert st["reason"] == "Evicted"
        assert st["message"].startswith("The node was low on resource: ephemeral-storage. "
                                        "Threshold quantity: "), st["message"]
        reclaimed = events(c, "NodeResourcesReclaimed")
        assert reclaimed and reclaimed[0]["message"].endswith(
            "must evict pod(s) to reclaim ephemeral-storage."), reclaimed
        evict_log = (c.handle.paths.logs_dir / "eviction.log").read_text()
        assert evict_log.index("eviction.reclaim.done") < evict_log.index(
            "eviction.pod.evicted")  # reclaimed first, then evicted
        gc_log = (c.handle.paths.logs_dir / "imagegc.log").read_text()
        assert "imagegc.reclaim.done" in gc_log
        assert c.phase("steady") == "Running"
    except AssertionError:
        print(c.logs())
        raise
    finally:
        c.api.stop()
