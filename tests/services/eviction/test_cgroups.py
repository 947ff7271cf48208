"""The memory signal on both cgroup hierarchies (``services/eviction/cgroups.py``), over file
trees the tests make: v2 (``memory.current`` less ``inactive_file``, ``memory.max`` with "max"
for none, the lowest limit of the ancestors, the root's usage from ``/proc/meminfo``) and v1
(``memory.usage_in_bytes`` less ``total_inactive_file``, ``memory.limit_in_bytes``); the
hierarchy chosen by ``statfs`` of ``/sys/fs/cgroup`` (``cgroup2fs``: v2), the real call checked
against ``stat -f``; the pods' usage for the ranking read from the same folders."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from podvisor.ipc.maps import DesiredPod
from podvisor.services.eviction.cgroups import (
    CGROUP2_SUPER_MAGIC,
    UNLIMITED,
    MemoryCgroups,
    detect_memory_cgroups,
    statfs_type,
)
from podvisor.services.eviction.signals import NodeSources, memory_observation
from podvisor.services.eviction.usage import UsageReader
from podvisor.services.pod import pod_from_dict
from tests.support.plegs import pleg_pod

MI = 1 << 20
GI = 1 << 30


def write(folder: Path, **files: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text)
    return folder


def v2_tree(tmp_path: Path) -> MemoryCgroups:
    """/ (the mount: no memory.current) > node (memory.max 400Mi) > kubepods (max)."""
    mount = write(tmp_path / "cg", memory_stat="anon 1\ninactive_file 100\n")
    write(mount / "node", **{"memory_max": f"{400 * MI}\n"})
    write(mount / "node/kubepods", **{"memory_max": "max\n", "memory_current": f"{300 * MI}\n",
                                      "memory_stat": f"anon {200 * MI}\nfile {100 * MI}\n"
                                                     f"active_file {40 * MI}\n"
                                                     f"inactive_file {60 * MI}\n"})
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:        8388608 kB\nMemFree:         2097152 kB\n")
    return MemoryCgroups(2, mount, meminfo)


def test_v2_working_set_is_memory_current_less_inactive_file(tmp_path: Path) -> None:
    cg = v2_tree(tmp_path)
    assert cg.working_set(cg.folder("/node/kubepods")) == 240 * MI
    assert cg.working_set(cg.folder("/node/absent")) == 0  # no pod ran yet


def test_v2_limit_is_the_lowest_memory_max_of_the_folder_and_its_ancestors(
        tmp_path: Path) -> None:
    cg = v2_tree(tmp_path)
    assert cg.limit(cg.folder("/node/kubepods")) == 400 * MI  # "max" here, 400Mi above
    assert cg.limit(cg.folder("/")) is None
    write(cg.folder("/node/kubepods"), **{"memory_max": f"{100 * MI}\n"})
    assert cg.limit(cg.folder("/node/kubepods")) == 100 * MI
    obs = memory_observation(cg, cg.folder("/node/kubepods"), 8 * GI)
    assert (obs.available, obs.capacity) == (0, 100 * MI)  # 240Mi used of 100Mi


def test_v2_memory_available_within_a_limited_parent(tmp_path: Path) -> None:
    cg = v2_tree(tmp_path)
    src = NodeSources(cg, cg.folder("/node/kubepods"), lambda: 8 * GI, str(tmp_path),
                      lambda: str(tmp_path))
    mem = src.observe()["memory.available"]
    assert (mem.available, mem.capacity) == (160 * MI, 400 * MI)


def test_v2_root_usage_comes_from_meminfo(tmp_path: Path) -> None:
    """runc's rootStatsFromMeminfo: MemTotal less MemFree, less the root's inactive_file."""
    cg = v2_tree(tmp_path)
    assert cg.working_set(cg.folder("")) == 6 * GI - 100
    obs = memory_observation(cg, cg.folder(""), 8 * GI)
    assert (obs.available, obs.capacity) == (2 * GI + 100, 8 * GI)


def test_v1_reads_stay_as_they_were(tmp_path: Path) -> None:
    mount = write(tmp_path / "memory", memory_limit_in_bytes=f"{UNLIMITED + 4096}\n")
    write(mount / "node", memory_limit_in_bytes=f"{400 * MI}\n")
    write(mount / "node/kubepods", memory_limit_in_bytes=f"{UNLIMITED + 4096}\n",
          memory_usage_in_bytes=f"{300 * MI}\n",
          memory_stat=f"cache {100 * MI}\ninactive_file {1}\ntotal_inactive_file {60 * MI}\n")
    cg = MemoryCgroups(1, mount)
    assert cg.working_set(cg.folder("/node/kubepods")) == 240 * MI
    assert cg.limit(cg.folder("/node/kubepods")) == 400 * MI
    assert cg.limit(cg.folder("")) is None


def test_the_hierarchy_is_chosen_by_the_filesystem_type_of_sys_fs_cgroup(
        tmp_path: Path) -> None:
    v2 = detect_memory_cgroups(tmp_path, lambda _p: CGROUP2_SUPER_MAGIC)
    assert (v2.version, v2.mount) == (2, tmp_path)
    v1 = detect_memory_cgroups(tmp_path, lambda _p: 0x01021994)  # tmpfs
    assert (v1.version, v1.mount) == (1, tmp_path / "memory")


@pytest.mark.skipif(shutil.which("stat") is None, reason="no stat(1)")
@pytest.mark.parametrize("where", ["/sys/fs/cgroup", "/proc", "TMP"])
def test_statfs_reads_the_type_stat_f_reports(where: str, tmp_path: Path) -> None:
    path = tmp_path if where == "TMP" else Path(where)
    if not path.exists():
        pytest.skip(f"no {path}")
    shown = subprocess.run(["stat", "-f", "-c", "%t", str(path)], capture_output=True,
                           text=True, check=True).stdout.strip()
    assert statfs_type(path) == int(shown, 16)
    if where == "/sys/fs/cgroup":
        name = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True,
                              text=True, check=True).stdout.strip()
        assert detect_memory_cgroups().version == (2 if name == "cgroup2fs" else 1)


def test_pod_usage_for_the_ranking_reads_the_v2_folders(tmp_path: Path) -> None:
    cg = v2_tree(tmp_path)
    pod = pod_from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "hog", "namespace": "default", "uid": "u1"}, "spec": {
        "containers": [{"name": "c", "image": "host"}]}}).pod
    folder = write(cg.folder("/node/kubepods/besteffort/podu1"),
                   memory_current=f"{120 * MI}\n", memory_stat=f"inactive_file {20 * MI}\n",
                   cgroup_procs="10\n11\n")
    write(folder / "cid1", memory_current=f"{110 * MI}\n",
          memory_stat=f"inactive_file {10 * MI}\n", cgroup_procs="11\n")
    reader = UsageReader(cg, "/node/kubepods", tmp_path / "pods", tmp_path / "logs")
    d = DesiredPod(pod=pod.to_dict(), source="api", qos_class="BestEffort")
    record = pleg_pod(ts=1.0, containers=[{
        "id": "cid1", "name": "c", "state": "CONTAINER_RUNNING", "sandbox_id": "s"}])
    [usage] = reader.read({"u1": d}, {"u1": record})
    assert usage.memory == 100 * MI and usage.containers[0].memory == 100 * MI
    assert usage.pids == 3  # cgroup.procs of the pod's folder and those under it
