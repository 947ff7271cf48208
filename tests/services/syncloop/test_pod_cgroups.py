"""Pod cgroups under cgroupRoot: the pure path logic, PodCgroups over the fake filesystem, and
the sync loop (CRI fake + cgroupfs fake) setting cgroup_parent and removing the folders."""

from __future__ import annotations

import errno
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from podvisor.common.logs import MemoryLogger
from podvisor.services.pod import pod_from_dict, qos_class
from podvisor.services.syncloop.cgroupfs import FakeCgroupFS, new_cgroup_fs
from podvisor.services.syncloop.network import NetworkState
from podvisor.services.syncloop.podcgroups import (
    CgroupMount,
    PodCgroupError,
    PodCgroups,
    PodLimits,
    hierarchy_dirs,
    limit_writes,
    parse_mountinfo,
    pod_cgroup_parent,
    pod_limits,
    pod_uid,
    removal_order,
)
from tests.services.syncloop.test_podworkers import Harness, manifest

# This VM's layout (hybrid: v1 controllers + v2 at unified), plus lines that must be ignored.
MOUNTINFO = """\
23 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 master:2 - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HIERARCHIES = ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/systemd",
               "/sys/fs/cgroup/unified"]


def test_parse_mountinfo_finds_v1_and_v2_and_unescapes() -> None:
    mounts = parse_mountinfo(MOUNTINFO + "50 31 0:40 /ns /mnt/with\\040space rw - cgroup2 none rw\n"
                             "garbage line\n")
    assert [m.mount_point for m in mounts] == [*HIERARCHIES, "/mnt/with space"]
    assert mounts[1] == CgroupMount("/sys/fs/cgroup/memory", "/", "cgroup", "rw,memory")
    assert (mounts[3].fstype, mounts[4].root) == ("cgroup2", "/ns")


def test_parse_mountinfo_of_this_host() -> None:
    mounts = parse_mountinfo(new_cgroup_fs().mountinfo())
    assert all(m.fstype in ("cgroup", "cgroup2") and m.mount_point.startswith("/")
               for m in mounts)


def test_hierarchy_dirs_map_through_the_mount_root() -> None:
    mounts = [CgroupMount("/sys/fs/cgroup/memory", "/", "cgroup", "rw,memory"),
              CgroupMount("/sys/fs/cgroup/cpu", "/docker/abc", "cgroup", "rw,cpu"),
              CgroupMount("/other", "/", "cgroup", "rw,memory"),
              CgroupMount("/sys/fs/cgroup/memory", "/", "cgroup", "rw,memory")]
    assert hierarchy_dirs(mounts, "/podvisor/pod1") == [
        "/sys/fs/cgroup/memory/podvisor/pod1", "/other/podvisor/pod1"]  # cpu: not visible
    assert hierarchy_dirs(mounts, "/docker/abc/podvisor/pod1")[1] == \
        "/sys/fs/cgroup/cpu/podvisor/pod1"


def test_names_and_order() -> None:
    assert pod_cgroup_parent("/podvisor", "u-1") == "/podvisor/podu-1"
    assert pod_cgroup_parent("/", "u") == "/podu" and pod_cgroup_parent("", "u") == ""
    assert pod_uid("pod0f3a-9") == "0f3a-9"
    assert pod_uid("pod") is None and pod_uid("abc") is None and pod_uid("pod/x") is None
    assert removal_order(["/a", "/a/b/c", "/a/b", "/a/b2"]) == ["/a/b/c", "/a/b", "/a/b2", "/a"]


def fake_fs(*cgroup_paths: str) -> FakeCgroupFS:
    return FakeCgroupFS(MOUNTINFO, [h + p for h in HIERARCHIES for p in cgroup_paths])


def test_remove_goes_deepest_first_on_every_hierarchy_and_keeps_the_root() -> None:
    fs = fake_fs("/podvisor/podu1/sandbox/nested", "/podvisor/podu1/ctr", "/podvisor/podu2/x")
    log = MemoryLogger()
    assert PodCgroups("/podvisor", fs, log).remove("u1")
    for h in HIERARCHIES:
        gone = [r for r in fs.removed if r.startswith(h + "/")]
        assert gone[-1] == f"{h}/podvisor/podu1"
        assert gone.index(f"{h}/podvisor/podu1/sandbox/nested") < \
            gone.index(f"{h}/podvisor/podu1/sandbox")
        assert f"{h}/podvisor" in fs.dirs and f"{h}/podvisor/podu2/x" in fs.dirs
    assert [e["event"] for e in log.events] == ["syncloop.pod.cgroup.removed"]
    assert log.events[0]["folders"] == 4 * len(HIERARCHIES)


def test_busy_folder_is_kept_logged_once_and_retried() -> None:
    fs = fake_fs("/podvisor/podu1/ctr")
    fs.busy.add("/sys/fs/cgroup/memory/podvisor/podu1/ctr")
    log = MemoryLogger()
    cg = PodCgroups("/podvisor", fs, log)
    assert not cg.remove("u1") and not cg.remove("u1")
    assert cg.pending() == {"u1"}
    assert "/sys/fs/cgroup/memory/podvisor/podu1" in fs.dirs          # never forced
    assert "/sys/fs/cgroup/cpu/podvisor/podu1" not in fs.dirs          # other hierarchies go
    assert [(e["event"], e["level"]) for e in log.events] == [
        ("syncloop.pod.cgroup.busy", "warning"), ("syncloop.pod.cgroup.busy", "debug")]
    assert "EBUSY" in log.events[0]["folders"][0]
    fs.busy.clear()
    assert cg.remove("u1") and cg.pending() == set()
    assert log.events[-1]["event"] == "syncloop.pod.cgroup.removed"
    assert log.events[-1]["retries"] == 2


def test_processes_left_in_a_pod_this_agent_terminated_are_killed() -> None:
    """The runtime shows nothing of the pod, yet a process is in its cgroup (containerd 1.6
    killed mid-burst: the `runc init` of a task its crash cut off, listed nowhere): it is
    killed, logged, and the folder goes at the next attempt (housekeeping's retry)."""
    fs = fake_fs("/podvisor/besteffort/podu1/ctr")
    fs.processes["/sys/fs/cgroup/memory/podvisor/besteffort/podu1/ctr"] = [4173, 4174]
    log = MemoryLogger()
    cg = PodCgroups("/podvisor", fs, log)
    assert not cg.remove("u1", kill_left=True)
    assert fs.killed == [4173, 4174] and cg.pending() == {"u1"}
    assert (log.events[0]["event"], log.events[0]["pids"]) == \
        ("syncloop.pod.cgroup.killed", [4173, 4174])
    assert cg.remove("u1")  # the retry (the processes are gone)
    assert not [d for d in fs.dirs if "podu1" in d] and cg.pending() == set()


def test_processes_in_a_pod_this_agent_does_not_know_are_left_alone() -> None:
    """The leftover scan finds ``pod<uid>`` folders of pods nobody here knows: another agent
    on the same cgroupRoot may run them. Never a kill there, at no retry."""
    fs = fake_fs("/podvisor/podu2/ctr")
    fs.processes["/sys/fs/cgroup/memory/podvisor/podu2/ctr"] = [99]
    cg = PodCgroups("/podvisor", fs, MemoryLogger())
    assert not cg.remove("u2") and not cg.remove("u2")
    assert fs.killed == [] and fs.processes["/sys/fs/cgroup/memory/podvisor/podu2/ctr"] == [99]


def test_a_terminated_pods_leftover_process_is_killed_by_the_sync_loop(tmp_path: Path) -> None:
    fs = fake_fs()
    h = harness(tmp_path, fs)
    h.set(manifest("p", "u1"))
    containerd_made(fs, "u1")
    fs.processes["/sys/fs/cgroup/memory/podvisor/besteffort/podu1"] = [4173]
    h.set()  # the manifest is gone: the pod is terminated, CRI shows nothing of it
    assert fs.killed == [4173]
    h.now += 3  # the next housekeeping
    h.settle()
    assert not [d for d in fs.dirs if "podu1" in d]


def test_other_errors_and_disabled_root() -> None:
    fs = fake_fs("/podvisor/podu1")
    fs.errors["/sys/fs/cgroup/cpu/podvisor/podu1"] = errno.EACCES
    cg = PodCgroups("/podvisor", fs, MemoryLogger())
    assert not cg.remove("u1") and cg.pending() == {"u1"}
    before = len(fs.calls)
    off = PodCgroups("", fs, MemoryLogger())
    assert off.remove("u1") and off.leftovers(set()) == set() and off.parent("u1") == ""
    assert len(fs.calls) == before                              # disabled: never touches it


def test_leftovers_are_unknown_pod_folders_only() -> None:
    fs = fake_fs("/podvisor/poda", "/podvisor/podb", "/podvisor/other", "/elsewhere/podc")
    fs.mkdir("/sys/fs/cgroup/unified/podvisor/podd")
    cg = PodCgroups("/podvisor", fs, MemoryLogger())
    assert cg.leftovers({"a"}) == {"b", "d"}


def test_parent_by_qos_class_and_every_place_searched() -> None:
    assert [pod_cgroup_parent("/podvisor", "u", q) for q in ("Guaranteed", "Burstable",
                                                             "BestEffort")] == [
        "/podvisor/podu", "/podvisor/burstable/podu", "/podvisor/besteffort/podu"]
    fs = fake_fs("/podvisor/poda", "/podvisor/burstable/podb", "/podvisor/besteffort/podc")
    cg = PodCgroups("/podvisor", fs, MemoryLogger())
    assert cg.leftovers(set()) == {"a", "b", "c"}
    assert cg.remove("b") and not [d for d in fs.dirs if "podb" in d]
    assert "/sys/fs/cgroup/cpu/podvisor/burstable" in fs.dirs


# --- the sync loop ---------------------------------------------------------------------------

def harness(tmp: Path, fs: FakeCgroupFS, **kw: Any) -> Harness:
    h = Harness(tmp, **kw)
    h.sync = h.loop.deps.sync = replace(h.sync, cgroups=PodCgroups("/podvisor", fs, h.log))
    return h


def containerd_made(fs: FakeCgroupFS, uid: str, qos_folder: str = "besteffort/") -> None:
    """What containerd leaves once a pod's sandbox is gone: the empty pod folder (the test
    pods have no resources: BestEffort)."""
    for h in HIERARCHIES:
        fs.mkdir(f"{h}/podvisor/{qos_folder}pod{uid}")


def test_sandbox_gets_cgroup_parent_and_removal_follows_termination(tmp_path: Path) -> None:
    fs = fake_fs()
    h = harness(tmp_path, fs)
    h.set(manifest("p", "u1"))
    [(cfg, _handler)] = h.cri.method_calls("RunPodSandbox")
    assert cfg.linux.cgroup_parent == "/podvisor/besteffort/podu1"   # by its QoS class
    containerd_made(fs, "u1")
    fs.busy.add("/sys/fs/cgroup/memory/podvisor/besteffort/podu1")   # a process lingers in it
    h.set()
    assert not h.cri.sandboxes and "u1" not in h.desired.items
    assert "/sys/fs/cgroup/cpu/podvisor/besteffort/podu1" not in fs.dirs
    assert "/sys/fs/cgroup/memory/podvisor/besteffort/podu1" in fs.dirs
    fs.busy.clear()
    h.now += 3                                                  # the next housekeeping
    h.settle()
    assert not [d for d in fs.dirs if "podu1" in d]
    assert "/sys/fs/cgroup/memory/podvisor/besteffort" in fs.dirs   # QoS folders stay


def test_orphan_pod_cgroups_go_with_the_orphan(tmp_path: Path) -> None:
    fs = fake_fs()
    first = harness(tmp_path, fs)
    first.set(manifest("keep", "u1"), manifest("gone", "u2"))
    containerd_made(fs, "u1")
    containerd_made(fs, "u2")
    h = harness(tmp_path, fs, cri=first.cri)                    # a restarted sync loop
    h.set(manifest("keep", "u1"))
    h.now += 3
    h.settle()
    assert {s.labels["io.kubernetes.pod.uid"] for s in h.cri.list_pod_sandbox()} == {"u1"}
    assert not [d for d in fs.dirs if "podu2" in d]
    assert "/sys/fs/cgroup/memory/podvisor/besteffort/podu1" in fs.dirs   # running: kept


def test_leftover_folders_removed_only_once_sources_are_ready(tmp_path: Path) -> None:
    fs = fake_fs("/podvisor/podcrashed", "/podvisor/podu1")
    h = harness(tmp_path, fs)
    h.now += 3
    h.settle()                                                  # no source has sent a set yet
    assert "/sys/fs/cgroup/cpu/podvisor/podcrashed" in fs.dirs
    h.set(manifest("p", "u1"))
    h.now += 3
    h.settle()
    assert not [d for d in fs.dirs if "podcrashed" in d]
    assert "/sys/fs/cgroup/cpu/podvisor/podu1" in fs.dirs       # desired pod: kept
    assert [r for r in fs.removed if "podu1" in r] == []


def test_leftover_scan_and_runtime_check_run_at_their_own_periods(tmp_path: Path) -> None:
    """Housekeeping runs every 2 s; within it the runtime's Status every 5 s and the scan for
    leftover pod folders every 30 s, counted from the last scan that ran."""
    fs = fake_fs("/podvisor/podu1")
    h = harness(tmp_path, fs)
    h.sync = h.loop.deps.sync = replace(h.sync, network=NetworkState())
    h.set(manifest("p", "u1"))
    h.settle()
    statuses = len(h.cri.method_calls("Status"))
    fs.mkdir("/sys/fs/cgroup/cpu/podvisor/podcrashed")
    for _ in range(6):                        # 12 s of housekeeping: no scan yet
        h.now += 2
        h.settle()
    assert "/sys/fs/cgroup/cpu/podvisor/podcrashed" in fs.dirs
    assert 2 <= len(h.cri.method_calls("Status")) - statuses <= 3  # every 5 s, not every 2 s
    h.now += 20                               # 30 s after the first scan
    h.settle()
    assert "/sys/fs/cgroup/cpu/podvisor/podcrashed" not in fs.dirs


def test_no_cgroup_root_no_parent(tmp_path: Path) -> None:
    h = Harness(tmp_path)                                       # cgroups=None (cgroupRoot "")
    h.set(manifest("p", "u1"))
    [(cfg, _handler)] = h.cri.method_calls("RunPodSandbox")
    assert cfg.linux.cgroup_parent == ""


# --- pod-level limits (the kubelet's ResourceConfigForPod) -----------------------------------

def _ctr(name: str, requests: dict[str, Any] | None = None,
         limits: dict[str, Any] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if requests:
        res["requests"] = requests
    if limits:
        res["limits"] = limits
    return {"name": name, "image": "host", "command": ["true"], "resources": res}


def _limits(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None,
            pids: int = -1) -> PodLimits | None:
    spec: dict[str, Any] = {"initContainers": init} if init else {}
    p = pod_from_dict(manifest(containers=containers, **spec)).pod
    return pod_limits(p, str(qos_class(p)), pids)


def test_pod_limits_are_the_kubelets_sums() -> None:
    g = {"cpu": "100m", "memory": "50Mi"}
    assert _limits([_ctr("a", limits=g), _ctr("b", limits=g)]) == PodLimits(
        cpu_shares=204, cpu_quota=20_000, memory_bytes=100 << 20)
    # Burstable: shares from every request; quota and memory only when ALL have a limit
    assert _limits([_ctr("a", {"cpu": "250m"}, {"cpu": "500m", "memory": "64Mi"}),
                    _ctr("b", {"cpu": "250m", "memory": "10Mi"})], pids=100) == PodLimits(
        cpu_shares=512, memory_bytes=None, cpu_quota=None, pids=100)
    assert _limits([_ctr("a", {"memory": "10Mi"})]) == PodLimits(cpu_shares=2)
    assert _limits([_ctr("a")]) is None  # BestEffort: no folder of podvisor's own
    # init containers: the larger of the regular sum and any one init container
    assert _limits([_ctr("a", limits=g)], init=[_ctr("i", limits={
        "cpu": "1", "memory": "20Mi"})]) == PodLimits(
        cpu_shares=1024, cpu_quota=100_000, memory_bytes=50 << 20)
    assert limit_writes(PodLimits(cpu_shares=204, cpu_quota=20_000, memory_bytes=1 << 20,
                                  pids=7), v2=True) == [
        ("cpu", "cpu.weight", "8"), ("cpu", "cpu.max", "20000 100000"),
        ("memory", "memory.max", "1048576"), ("pids", "pids.max", "7")]


def test_ensure_writes_v1_limits_before_the_sandbox(tmp_path: Path) -> None:
    fs = fake_fs()
    h = harness(tmp_path, fs)
    g = {"cpu": "100m", "memory": "50Mi"}
    h.set(manifest("p", "u1", containers=[_ctr("a", limits=g), _ctr("b", limits=g)]))
    [(cfg, _handler)] = h.cri.method_calls("RunPodSandbox")
    assert cfg.linux.cgroup_parent == "/podvisor/podu1"
    assert {k: v for k, v in fs.files.items() if "podu1" in k} == {
        "/sys/fs/cgroup/cpu/podvisor/podu1/cpu.shares": "204",
        "/sys/fs/cgroup/cpu/podvisor/podu1/cpu.cfs_period_us": "100000",
        "/sys/fs/cgroup/cpu/podvisor/podu1/cpu.cfs_quota_us": "20000",
        "/sys/fs/cgroup/memory/podvisor/podu1/memory.limit_in_bytes": str(100 << 20)}
    writes = [i for i, c in enumerate(fs.calls) if c[0] == "write"]
    assert writes  # and the sandbox came after them (the fake CRI was called once, above)


def test_ensure_on_v2_enables_the_controllers_down_the_tree() -> None:
    fs = FakeCgroupFS("41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
                      ["/sys/fs/cgroup"])
    fs.files["/sys/fs/cgroup/cgroup.subtree_control"] = "cpu memory"
    p = pod_from_dict(manifest(containers=[_ctr("a", limits={"cpu": "1", "memory": "1Mi"})])
                      ).pod
    PodCgroups("/podvisor", fs, MemoryLogger(), pids_limit=50).ensure(p, "Guaranteed")
    assert fs.files["/sys/fs/cgroup/podvisor/podu1/memory.max"] == str(1 << 20)
    assert fs.files["/sys/fs/cgroup/podvisor/podu1/cpu.max"] == "100000 100000"
    assert fs.files["/sys/fs/cgroup/podvisor/podu1/pids.max"] == "50"
    assert fs.files["/sys/fs/cgroup/cgroup.subtree_control"] == "+pids"  # the one missing
    assert fs.files["/sys/fs/cgroup/podvisor/cgroup.subtree_control"] == "+pids"


def test_a_pod_cgroup_that_cannot_be_limited_keeps_the_pod_pending(tmp_path: Path) -> None:
    fs = fake_fs()
    fs.write_errors["/sys/fs/cgroup/memory/podvisor/podu1/memory.limit_in_bytes"] = errno.EBUSY
    h = harness(tmp_path, fs)
    g = {"cpu": "100m", "memory": "50Mi"}
    h.set(manifest("p", "u1", containers=[_ctr("a", limits=g)]))
    assert h.cri.method_calls("RunPodSandbox") == []
    assert h.desired.items["u1"].message == (
        "pod cgroup: /sys/fs/cgroup/memory/podvisor/podu1/memory.limit_in_bytes: Device or "
        "resource busy")
    # a host without the pids controller mounted: refused with the reason, never ignored
    fs2 = fake_fs()
    cg = PodCgroups("/podvisor", fs2, MemoryLogger(), pids_limit=10)
    with pytest.raises(PodCgroupError, match="the pids cgroup controller is not mounted"):
        cg.ensure(pod_from_dict(manifest(containers=[_ctr("a", limits=g)])).pod, "Guaranteed")
